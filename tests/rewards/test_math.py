"""MathReward against a table of answers as models actually write them, right and wrong."""

import pytest

from forge_exp.rewards.math import MathReward, canonical, parse_number

# (response, target, expected reward)
CASES = [
    # where the answer is
    ("<answer>42</answer>", "42", 1.0),
    ("<think>6*7</think><answer> 42 </answer>", "42", 1.0),
    ("So the total is \\boxed{42}.", "42", 1.0),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72", 1.0),
    ("<answer>\\boxed{42}</answer>", "42", 1.0),
    ("\\boxed{41} is wrong, the right one is \\boxed{42}", "42", 1.0),  # the last box counts
    ("<answer>41</answer> then \\boxed{42}", "42", 0.0),  # <answer> is preferred over \boxed
    ("We get 6 * 7 = 42", "42", 1.0),  # last-number fallback
    ("The answer is 42, not 41", "42", 0.0),  # ... is the last number only
    ("<think>\\boxed{7}</think><answer>42</answer>", "7", 0.0),  # thinking is not the answer
    ("<think>the answer may be 42 but let me check", "42", 0.0),  # cut off while thinking
    ("", "42", 0.0),
    ("I don't know.", "42", 0.0),
    # thousands separators
    ("<answer>1,234</answer>", "1234", 1.0),
    ("\\boxed{1{,}234}", "1234", 1.0),
    ("#### 1,234,567", "1234567", 1.0),
    ("\\boxed{1\\,234}", "1234", 1.0),
    ("<answer>1,234</answer>", "1234.5", 0.0),
    # fractions
    ("<answer>3/4</answer>", "0.75", 1.0),
    ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{\\tfrac12}", "0.5", 1.0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.3333333", 1.0),  # within rel_tol
    ("<answer>0.33</answer>", "1/3", 0.0),  # not within rel_tol
    ("\\boxed{\\frac{3}{4}}", "4/3", 0.0),
    ("<answer>1/0</answer>", "0", 0.0),
    # units and currency
    ("<answer>$18</answer>", "18", 1.0),
    ("\\boxed{\\$18.00}", "18", 1.0),
    ("<answer>18 dollars</answer>", "18", 1.0),
    ("\\boxed{5\\text{ cm}}", "5", 1.0),
    ("<answer>5 cm^2</answer>", "5", 1.0),
    ("\\boxed{5\\mathrm{cm}}", "5", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("<answer>19 dollars</answer>", "18", 0.0),
    # signs
    ("<answer>-5</answer>", "-5", 1.0),
    ("<answer>\u22125</answer>", "-5", 1.0),  # unicode minus
    ("\\boxed{+5}", "5", 1.0),
    ("<answer>5</answer>", "-5", 0.0),
    ("The result is 10 - 3 = 7", "7", 1.0),
    ("3-5", "-5", 0.0),  # a binary minus is not a sign
    # percentages and decimals
    ("<answer>50%</answer>", "50", 1.0),
    ("\\boxed{50\\%}", "0.5", 1.0),
    ("<answer>50 percent</answer>", "0.5", 1.0),
    ("<answer>0.5</answer>", "50%", 1.0),
    ("<answer>2.50</answer>", "2.5", 1.0),
    ("<answer>.5</answer>", "0.5", 1.0),
    ("<answer>2.5</answer>", "25", 0.0),
    # LaTeX wrappers, trailing period, prose
    ("\\boxed{\\text{42}}", "42", 1.0),
    ("$\\boxed{42}$.", "42", 1.0),
    ("<answer>42.</answer>", "42", 1.0),
    ("<answer>x = 5</answer>", "5", 1.0),
    ("<answer>The answer is 42.</answer>", "42", 1.0),
    ("<answer>\\(42\\)</answer>", "42", 1.0),
    ("\\boxed 7.", "7", 1.0),
    ("\\boxed{2x}", "2", 0.0),  # an expression, not 2 with a unit
    ("\\boxed{x^2+1}", "1", 0.0),
    # symbolic targets (MATH): compared after normalisation
    ("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{\\text{(B)}}", "(B)", 1.0),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{3}", 0.0),
    ("\\boxed{}", "\\sqrt{3}", 0.0),
]


@pytest.mark.parametrize(("response", "target", "expected"), CASES)
def test_math_reward_table(response, target, expected):
    assert MathReward()("prompt", response, target) == expected


def test_table_is_large_and_balanced():
    assert len(CASES) >= 40
    assert sum(e == 0.0 for *_, e in CASES) >= 15


@pytest.mark.parametrize(
    ("kwargs", "response", "target", "expected"),
    [
        ({"fallback_last_number": False}, "We get 6 * 7 = 42", "42", 0.0),
        ({"fallback_last_number": False}, "<answer>42</answer>", "42", 1.0),
        ({"formats": ["boxed"]}, "<answer>41</answer> then \\boxed{42}", "42", 1.0),
        ({"formats": ["gsm8k"], "fallback_last_number": False}, "\\boxed{42}", "42", 0.0),
        ({"rel_tol": 0.02}, "<answer>0.33</answer>", "1/3", 1.0),
        ({"rel_tol": 0.0, "abs_tol": 0.5}, "<answer>41.6</answer>", "42", 1.0),
        ({"ignore_thinking": False}, "<think>\\boxed{7}</think>", "7", 1.0),
    ],
)
def test_options(kwargs, response, target, expected):
    assert MathReward(**kwargs)("prompt", response, target) == expected


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="^rel_tol must be"):
        MathReward(rel_tol=-1.0)
    with pytest.raises(ValueError, match="unknown answer format 'latex'"):
        MathReward(formats=["latex"])


def test_parse_number_and_canonical():
    assert parse_number("1{,}234 dollars") == (1234.0, False)
    assert parse_number("50\\%") == (50.0, True)
    assert parse_number("x^2") is None
    assert canonical("\\left( \\dfrac{1}{2}, 3 \\right).") == canonical("(1/2,3)")


@pytest.mark.parametrize("text", ["\\boxed{" * 3000, "<answer>" * 5000, "x" * 20000, "{" * 10000 + "1"])
def test_adversarial_responses_score_in_linear_time(text):
    """A policy can emit anything; a quadratic regex on 20k characters would stall the reward workers (minutes
    here). The bound is far above linear time (~10 ms) so a busy machine does not fail it."""
    import time

    from forge_exp.rewards import FormatReward, ThinkingReward

    start = time.perf_counter()
    for fn in (MathReward(), FormatReward(formats=["answer", "boxed"], strict=True), ThinkingReward()):
        assert fn("Q", text, "42") == 0.0
    assert time.perf_counter() - start < 5.0
