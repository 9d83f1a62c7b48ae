import pytest

from forge_exp.envs.safe_eval import MAX_CHARS, EvalError, format_number, safe_eval


@pytest.mark.parametrize(
    "expr, value",
    [("1234*5678", 7006652), ("7/2", 3.5), ("7//2", 3), ("-7 % 3", 2), ("2**10", 1024), ("(1+2)*-3", -9),
     ("+4", 4), (" 12 - 30 ", -18), ("1.5*4", 6.0), ("2**-1", 0.5)],
)
def test_arithmetic_values(expr, value):
    assert safe_eval(expr) == value


@pytest.mark.parametrize(
    "expr",
    ["__import__('os').system('true')", "open('x')", "x", "(1).real", "[1, 2]", "'a' * 3", "True + 1",
     "lambda: 1", "1 if 1 else 2", "1 < 2", "a := 3", "1; 2", ""],
)
def test_anything_but_numbers_and_operators_is_refused(expr):
    with pytest.raises(EvalError):
        safe_eval(expr)


@pytest.mark.parametrize("expr", ["9**9**9", "10**101", "2**100000", "(10**60)*(10**60)", "1e300*1e300", "(-8)**0.5"])
def test_unbounded_results_are_refused_before_they_cost_anything(expr):
    with pytest.raises(EvalError):
        safe_eval(expr)


def test_division_by_zero_and_size_limits():
    for expr in ("1/0", "1//0", "1%0", "0**-1"):
        with pytest.raises(EvalError, match="division by zero"):
            safe_eval(expr)
    with pytest.raises(EvalError, match="longer"):
        safe_eval("1+" * MAX_CHARS + "1")
    with pytest.raises(EvalError, match="parts"):
        safe_eval("+".join(["1"] * 100))
    assert safe_eval("(" * 120 + "1" + ")" * 120) == 1  # parentheses make no nodes; no RecursionError either
    with pytest.raises(EvalError):
        safe_eval("-" * 200 + "1")  # 200 unary nodes


def test_format_number():
    assert [format_number(v) for v in (7006652, 6 / 3, 3.5, 1 / 3, -2.0)] == ["7006652", "2", "3.5", "0.333333333333", "-2"]
