"""A bounded arithmetic evaluator for model-written expressions: nothing of the model's text is ever executed.

Why an AST walk rather than a sandboxed subprocess: the calculator's language is numbers and `+ - * / // % **`
with unary signs and parentheses, so a grammar that admits only those leaves nothing to escape to — no names, calls,
attributes or subscripts exist in it — and the work is bounded by construction (expression length, node count,
magnitude of every intermediate value, exponent size). A call costs microseconds; a subprocess with CPU/memory
rlimits costs a process start per call (tens of ms on a small machine, times thousands of calls a step) and is
the right tool only for a language whose work cannot be bounded up front (a general Python tool). The episode
driver's per-call timeout stays as a backstop.

    safe_eval("1234*5678")   -> 7006652
    safe_eval("7/2")         -> 3.5
    format_number(6/3)       -> "2"
"""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 256  # checked before parsing: ast.parse itself recurses on deeply nested input
MAX_NODES = 128
MAX_ABS = 10**100  # every intermediate value stays below this in magnitude
MAX_EXPONENT = 512

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class EvalError(ValueError):
    """The expression is not arithmetic, or its value is out of bounds. The message is shown to the model."""


def safe_eval(expression: str) -> int | float:
    if not isinstance(expression, str):
        raise EvalError(f"expression must be text, got {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise EvalError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise EvalError(f"not an arithmetic expression: {type(e).__name__}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise EvalError(f"expression has {nodes} parts, more than {MAX_NODES}")
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EvalError(f"only numbers are allowed, got {value!r}")
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise EvalError("division by zero") from None
        except OverflowError:
            raise EvalError("result too large") from None
    raise EvalError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse before computing: 9**9**9 would otherwise run for hours inside one C call."""
    if abs(exponent) > MAX_EXPONENT:
        raise EvalError(f"exponent {exponent} larger than {MAX_EXPONENT}")
    if abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > math.log10(MAX_ABS):
        raise EvalError("result too large")
    if base == 0 and exponent < 0:
        raise EvalError("division by zero")


def _bounded(value: int | float | complex) -> int | float:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise EvalError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise EvalError("result is not finite")
    if abs(value) >= MAX_ABS:
        raise EvalError("result too large")
    return value


def format_number(value: int | float) -> str:
    """Integers exactly; integral floats without the `.0` (6/3 -> "2"); other floats to 12 significant digits."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".12g")
    return str(value)
