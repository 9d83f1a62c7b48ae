"""ExactAnswerReward: 1.0 only for exactly the target, whitespace and anything after EOS aside."""

import pytest

from forge_exp.rewards.arithmetic import ExactAnswerReward


@pytest.mark.parametrize(
    "response, target, expected",
    [
        ("85", "85", 1.0),
        (" 85 \n", "85", 1.0),
        ("85<eos>", "85", 1.0),
        ("85<eos>12<pad><pad>", "85", 1.0),
        ("85", " 85", 1.0),
        ("86", "85", 0.0),
        ("085", "85", 0.0),
        ("8 5", "85", 0.0),
        ("851", "85", 0.0),
        ("", "85", 0.0),
        ("<eos>85", "85", 0.0),
        ("-3", "-3", 1.0),
    ],
)
def test_exact_answer(response, target, expected):
    assert ExactAnswerReward()("37+48=", response, target) == expected


def test_custom_eos_text():
    reward = ExactAnswerReward(eos_text="<|im_end|>")
    assert reward("q", "12<|im_end|>junk", "12") == 1.0
    assert reward("q", "12<eos>", "12") == 0.0
    assert ExactAnswerReward(eos_text="")("q", "12", "12") == 1.0
