"""A reward for reasoning in a well-formed `<think>...</think>` block before answering (the R1-Zero format).

Well-formed means: one opening and one closing tag, in that order, nothing but whitespace before the opening tag,
at least `min_chars` non-space characters of reasoning inside, and — when `require_answer_after` — something
after the closing tag (the answer comes after the thinking, not inside it).

Chat templates of reasoning models (Qwen3, DeepSeek-R1 distills) often end the prompt with `<think>`, so the
model writes only the closing tag. When the prompt ends with the opening tag, the response is read as if it
started with it.
"""

from __future__ import annotations


class ThinkingReward:
    """1.0 for a well-formed reasoning block, else 0.0. `reward(prompt, response, target) -> float`."""

    def __init__(
        self,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
        min_chars: int = 1,
        require_answer_after: bool = True,
    ):
        if not open_tag or not close_tag or open_tag == close_tag:
            raise ValueError(
                f"open_tag and close_tag must be two different non-empty strings, got {open_tag!r} and {close_tag!r}"
            )
        if min_chars < 0:
            raise ValueError(f"min_chars must be >= 0, got {min_chars}")
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.min_chars = min_chars
        self.require_answer_after = require_answer_after

    def __call__(self, prompt: str, response: str, target: str) -> float:
        text = response
        if prompt.rstrip().endswith(self.open_tag) and self.open_tag not in response:
            text = self.open_tag + response
        text = text.lstrip()
        if not text.startswith(self.open_tag):
            return 0.0
        if text.count(self.open_tag) != 1 or text.count(self.close_tag) != 1:
            return 0.0
        inside, _, after = text[len(self.open_tag):].partition(self.close_tag)
        if len("".join(inside.split())) < self.min_chars:
            return 0.0
        if self.require_answer_after and not after.strip():
            return 0.0
        return 1.0
