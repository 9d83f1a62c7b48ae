"""Where the final answer sits in a response, and a reward for putting it there.

The span finders here are shared: `MathReward` reads the answer through them, `FormatReward` only checks that it
is there. Formats:

    "answer"  <answer> ... </answer>           (the last pair)
    "boxed"   \\boxed{...} or \\fbox{...}       (the last one; nested braces; `\\boxed 5` without braces too)
    "gsm8k"   #### 42                          (the text after the last `####`, to the end of its line)
    "full"    the whole text, stripped          (for prompts that ask for the bare answer and nothing else)
"""

from __future__ import annotations

import re

ANSWER_FORMATS = ("answer", "boxed", "gsm8k")  # the default order of MathReward's search
FORMATS = (*ANSWER_FORMATS, "full")  # every format a reward can read

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{)?")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")


def find_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    closing = _matching_braces(text)  # one pass, so adversarial text ("\\boxed{" * 10**4) stays linear
    for match in reversed(matches):
        if match.group(1) is None:  # `\boxed 5`: the next whitespace-delimited token
            token = text[match.end():].split(maxsplit=1)
            if token:
                return token[0].rstrip(".$")
            continue
        end = closing.get(match.end() - 1)
        if end is not None:
            return text[match.end():end]
        # unbalanced: an earlier, complete box may still exist
    return None


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each `{` → position of its `}`."""
    stack, pairs = [], {}
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def find_answer_tag(text: str) -> str | None:
    """Content of the last <answer>...</answer> pair, or None. (rfind, not a regex: linear on any input.)"""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len("<answer>"):end]


def find_gsm8k(text: str) -> str | None:
    matches = _GSM8K.findall(text)
    return matches[-1] if matches else None


def find_full(text: str) -> str | None:
    return text.strip() or None


_FINDERS = {"answer": find_answer_tag, "boxed": find_boxed, "gsm8k": find_gsm8k, "full": find_full}


def check_formats(formats: tuple[str, ...] | list[str], key: str = "formats") -> tuple[str, ...]:
    formats = tuple(formats)
    if not formats:
        raise ValueError(f"{key} is empty: give at least one of {FORMATS}")
    for fmt in formats:
        if fmt not in _FINDERS:
            raise ValueError(f"{key}: unknown answer format {fmt!r}; choose from {FORMATS}")
    return formats


def find_answer(text: str, formats: tuple[str, ...] = ANSWER_FORMATS) -> str | None:
    """The answer span of the first format in `formats` that the text uses. A `\\boxed{}` inside an
    `<answer>` tag is unwrapped (models often write both)."""
    for fmt in formats:
        span = _FINDERS[fmt](text)
        if span is None:
            continue
        if fmt != "boxed":
            span = find_boxed(span) or span
        return span.strip()
    return None


def after_thinking(response: str, close_tag: str = "</think>") -> str:
    """The part of a response after its last reasoning block (the whole response when there is none)."""
    head, sep, tail = response.rpartition(close_tag)
    return tail if sep else response


class FormatReward:
    """1.0 when the response states a non-empty answer in one of the configured formats, else 0.0.

    `strict=True` also asks that nothing but whitespace follows the answer (the answer ends the response) and
    that it is stated once — the shape a parser downstream can rely on.
    """

    def __init__(self, formats: tuple[str, ...] | list[str] = ("answer",), strict: bool = False):
        self.formats = check_formats(formats)
        self.strict = strict

    def __call__(self, prompt: str, response: str, target: str) -> float:
        text = after_thinking(response)
        for fmt in self.formats:
            span = _FINDERS[fmt](text)
            if span is None or not span.strip():
                continue
            if self.strict and not self._ends_with_single(text, fmt):
                continue
            return 1.0
        return 0.0

    @staticmethod
    def _ends_with_single(text: str, fmt: str) -> bool:
        text = text.rstrip()
        if fmt == "full":  # the answer is the response
            return True
        if fmt == "answer":
            return text.endswith("</answer>") and text.count("<answer>") == 1
        if fmt == "gsm8k":
            return text.count("####") == 1 and "\n" not in text[text.index("####"):]
        # boxed: the last box closes at the end, give or take a trailing period or math delimiter
        return len(_BOXED.findall(text)) == 1 and re.search(r"\}\s*(\$+|\\\]|\\\))?\s*\.?$", text) is not None
