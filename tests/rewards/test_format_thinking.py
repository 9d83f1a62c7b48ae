"""ThinkingReward and FormatReward: the shape of a response, not its correctness."""

import pytest

from forge_exp.rewards.format import FormatReward, find_answer, find_boxed
from forge_exp.rewards.thinking import ThinkingReward


@pytest.mark.parametrize(
    ("prompt", "response", "expected"),
    [
        ("Q", "<think>6 times 7</think><answer>42</answer>", 1.0),
        ("Q", "  <think>\nsteps\n</think>\n\\boxed{42}", 1.0),
        ("Q", "<think></think><answer>42</answer>", 0.0),  # empty
        ("Q", "<think>   </think><answer>42</answer>", 0.0),  # only whitespace
        ("Q", "<answer>42</answer><think>why</think> ok", 0.0),  # thinking after the answer
        ("Q", "<think>a</think><think>b</think> 42", 0.0),  # twice
        ("Q", "<think>still going", 0.0),  # never closed
        ("Q", "</think> 42", 0.0),  # never opened
        ("Q", "<think>steps</think>", 0.0),  # nothing after the thinking
        ("Q", "42", 0.0),
        ("<|assistant|><think>\n", "steps</think> 42", 1.0),  # the template opened the block
    ],
)
def test_thinking_reward(prompt, response, expected):
    assert ThinkingReward()(prompt, response, "42") == expected


def test_thinking_options():
    assert ThinkingReward(require_answer_after=False)("Q", "<think>steps</think>", "") == 1.0
    assert ThinkingReward(min_chars=10)("Q", "<think>short</think> 1", "") == 0.0
    tags = ThinkingReward(open_tag="<reasoning>", close_tag="</reasoning>")
    assert tags("Q", "<reasoning>r</reasoning> 1", "") == 1.0
    with pytest.raises(ValueError, match="min_chars"):
        ThinkingReward(min_chars=-1)


@pytest.mark.parametrize(
    ("kwargs", "response", "expected"),
    [
        ({}, "<think>r</think><answer>42</answer>", 1.0),
        ({}, "<answer>  </answer>", 0.0),
        ({}, "\\boxed{42}", 0.0),
        ({"formats": ["boxed"]}, "so \\boxed{42}", 1.0),
        ({"formats": ["boxed"]}, "so \\boxed{42", 0.0),  # unbalanced
        ({"formats": ["answer", "boxed"]}, "\\boxed{\\frac{1}{2}}", 1.0),
        ({"strict": True}, "<answer>42</answer>\n", 1.0),
        ({"strict": True}, "<answer>42</answer> and more words", 0.0),
        ({"strict": True}, "<answer>41</answer><answer>42</answer>", 0.0),
        ({"formats": ["boxed"], "strict": True}, "The answer is $\\boxed{42}$.", 1.0),
        ({}, "<think><answer>42</answer></think>", 0.0),  # inside the thinking does not count
    ],
)
def test_format_reward(kwargs, response, expected):
    assert FormatReward(**kwargs)("Q", response, "42") == expected


def test_span_finders():
    assert find_boxed("\\boxed{\\frac{a}{\\sqrt{b}}} and \\fbox{x}") == "x"
    assert find_boxed("a \\boxed{\\frac{a}{\\sqrt{b}}}") == "\\frac{a}{\\sqrt{b}}"
    assert find_answer("#### 12\n", ("answer", "gsm8k")) == "12"
    assert find_answer("nothing here") is None
    with pytest.raises(ValueError, match="unknown answer format"):
        FormatReward(formats=["xml"])
