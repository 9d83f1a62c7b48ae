"""Math answer correctness: 1.0 when the response's final answer equals the target, else 0.0.

    answer span:  <answer>…</answer> | \\boxed{…} | #### … (first configured format present, see format.py),
                  else (if enabled) the last number of the response
    numbers:      1,234  1{,}234  3/4  \\frac{3}{4}  \\dfrac12  -5  −5 (U+2212)  +5  .5  2.50  1e3  50%  50\\%
                  $18  \\$18  18 dollars  5 cm  5\\text{ cm}  90^\\circ  x = 5  "The answer is 42."
    equality:     |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol)  (math.isclose); a percentage p also
                  matches p/100, so 50% == 0.5 == 50
    non-numeric targets (MATH answers like \\sqrt{2} or (1, 2)): equal after LaTeX normalisation (spaces,
                  \\left/\\right, \\dfrac→\\frac, \\text{}, $…$ removed).

Deliberately not handled (a researcher can subclass or add a reward next to this one): symbolic equivalence
(x+1 vs 1+x; sympy-based graders such as Minerva's or math-verify do this), mixed numbers (1 1/2), spaces as
thousands separators (1 234), European decimal commas (0,5), "18 dollars and 50 cents".
"""

from __future__ import annotations

import math
import re

from forge_exp.rewards.format import ANSWER_FORMATS, after_thinking, check_formats, find_answer

_NUM = r"[+-]?\s*(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?"
# A unit: words, optionally squared/cubed and "per" something (cm, cm^2, m/s, square feet). A lone letter glued
# to the number ("2x") is an expression, not a unit, so a one-letter unit needs a space before it.
_UNIT_TAIL = r"(?:[ .]+[a-zA-Z]+)*\.?(?:\^\{?\d\}?)?(?:/[a-zA-Z]+(?:\^\{?\d\}?)?)?"
_UNIT = rf"\s+[a-zA-Z]+{_UNIT_TAIL}|[a-zA-Z]{{2,}}{_UNIT_TAIL}"
_STRICT = re.compile(
    rf"^(?:[a-zA-Z]\w*\s*=\s*)?(?P<num>{_NUM})(?:\s*/\s*(?P<den>{_NUM}))?"
    rf"(?:\s*(?P<pct>%|(?i:percent)\b))?(?P<unit>{_UNIT})?$"
)
# A number in running text. A sign counts only where it cannot be a binary minus ("3-5" is not -5).
_FREE = re.compile(
    r"(?P<num>(?:(?<![\w)])-)?(?:\d+(?:\.\d+)?|\.\d+))(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?(?P<pct>\s*%)?"
)
_OPERATORS = re.compile(r"[\^*=\\{}_+]")  # a span with these is an expression: no last-number guessing in it
_PROSE = re.compile(r"(?<![a-zA-Z])[a-zA-Z]{2,}\s|\s[a-zA-Z]{2,}")  # "The answer is 42." (but not "2x")

_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d)\s*(\d)")  # \frac12
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DROP = (
    "\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\quad", "\\displaystyle",
    "\\(", "\\)", "\\[", "\\]", "\\$", "$", "^\\circ", "^{\\circ}", "°", "\\%",
)


def clean_latex(text: str) -> str:
    """Strip the LaTeX and typography that do not change a value: wrappers, spacing, math delimiters,
    currency and degree signs, thousands separators, unicode minus, a trailing period."""
    s = text.strip().replace("\u2212", "-").replace("\uff0d", "-").replace("{,}", ",")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\%", "%")  # before dropping "\\" pieces, so 50\% keeps its meaning
    for _ in range(3):  # nested wrappers: \text{\textbf{5}}
        s = _WRAPPERS.sub(r"\1", s)
    for piece in _DROP:
        s = s.replace(piece, " " if piece in ("\\ ", "\\quad") else "")
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}" if _is_plain(m.group(1), m.group(2)) else m.group(0), s)
    s = _THOUSANDS.sub("", s)
    return " ".join(s.split()).rstrip(".").strip()


def _is_plain(*parts: str) -> bool:
    return all(re.fullmatch(rf"\s*{_NUM}\s*", p) for p in parts)


def _value(num: str, den: str | None, pct: str | None) -> tuple[float, bool] | None:
    try:
        value = float(num.replace(" ", ""))
        if den is not None:
            value /= float(den.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None
    if not math.isfinite(value):
        return None
    return value, bool(pct and pct.strip())


def parse_number(text: str) -> tuple[float, bool] | None:
    """`(value, is_percent)` when the whole text states one number (with an optional unit, currency, or
    `x =` in front), else None."""
    m = _STRICT.match(clean_latex(text))
    return None if m is None else _value(m.group("num"), m.group("den"), m.group("pct"))


def last_number(text: str) -> tuple[float, bool] | None:
    """`(value, is_percent)` of the last number in running text, or None."""
    matches = list(_FREE.finditer(clean_latex(text)))
    if not matches:
        return None
    m = matches[-1]
    return _value(m.group("num"), m.group("den"), m.group("pct"))


def canonical(text: str) -> str:
    """A normal form for comparing non-numeric answers as strings."""
    s = re.sub(r"\s+", "", clean_latex(text))
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}":
        s = s[1:-1]
    return s


class MathReward:
    """Correctness of the final answer. A torchforge-style reward: `reward(prompt, response, target) -> float`.

    Args:
        formats: where to look for the answer, in order of preference (see format.py).
        fallback_last_number: with no answer in any format, use the last number of the response. Helps models
            that have not learnt the format yet; turn off once a format reward is in the mix.
        rel_tol, abs_tol: numeric tolerance (math.isclose).
        ignore_thinking: read the answer only after the last </think>; an unclosed <think> means no answer yet.
    """

    def __init__(
        self,
        formats: tuple[str, ...] | list[str] = ANSWER_FORMATS,
        fallback_last_number: bool = True,
        rel_tol: float = 1e-4,
        abs_tol: float = 1e-8,
        ignore_thinking: bool = True,
    ):
        for key, tol in (("rel_tol", rel_tol), ("abs_tol", abs_tol)):
            if not (math.isfinite(tol) and tol >= 0):
                raise ValueError(f"{key} must be a finite number >= 0, got {tol}")
        self.formats = check_formats(formats)
        self.fallback_last_number = fallback_last_number
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol
        self.ignore_thinking = ignore_thinking

    def __call__(self, prompt: str, response: str, target: str) -> float:
        text = response
        if self.ignore_thinking:
            if "<think>" in response and "</think>" not in response:
                return 0.0  # cut off while still reasoning
            text = after_thinking(response)
        expected = parse_number(target)
        span = find_answer(text, self.formats)
        if span is None:
            if not (self.fallback_last_number and expected is not None):
                return 0.0
            return float(self._equal(last_number(text), expected))
        if expected is None:  # a symbolic target: compare normal forms
            return float(canonical(span) == canonical(target) and canonical(span) != "")
        got = parse_number(span)
        plain = clean_latex(span)
        if got is None and _PROSE.search(plain) and not _OPERATORS.search(plain):  # "The answer is 42."
            got = last_number(span)
        return float(self._equal(got, expected))

    def _equal(self, got: tuple[float, bool] | None, expected: tuple[float, bool]) -> bool:
        if got is None:
            return False
        (a, a_pct), (b, b_pct) = got, expected
        candidates = [a, a / 100] if a_pct else [a]
        references = [b, b / 100] if b_pct else [b]
        return any(
            math.isclose(x, y, rel_tol=self.rel_tol, abs_tol=self.abs_tol) for x in candidates for y in references
        )
