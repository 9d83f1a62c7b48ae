"""Exact-answer reward for the arithmetic task: 1.0 when the response is the target, else 0.0."""

from __future__ import annotations


class ExactAnswerReward:
    """`reward(prompt, response, target) -> 1.0 | 0.0`.

    The response is cut at the first `eos_text` (when the generator's text still carries it) and stripped of
    whitespace before comparing with the stripped target; anything else (extra tokens, a leading zero) scores 0.
    """

    def __init__(self, eos_text: str = "<eos>") -> None:
        self.eos_text = eos_text

    def __call__(self, prompt: str, response: str, target: str) -> float:
        if self.eos_text:
            response = response.split(self.eos_text, 1)[0]
        return 1.0 if response.strip() == target.strip() else 0.0
