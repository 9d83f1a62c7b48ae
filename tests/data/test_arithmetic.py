"""The synthetic arithmetic task: correct targets, a fixed held-out set, and a training stream that never meets it."""

import itertools

import pytest

from forge_exp.data.arithmetic import ArithmeticTask, max_eval_size, make_problem


def test_problems_are_formatted_and_correct():
    p = make_problem(37, "+", 48)
    assert (p.prompt, p.target, p.question) == ("37+48=", "85", "37+48")
    task = ArithmeticTask(digits=2, ops="+-*/", eval_size=100)
    for p in itertools.chain(task.heldout(), itertools.islice(task.train_stream(0), 2000)):
        a, op, b = split(p.question)
        assert p.prompt == p.question + "="
        assert 0 <= a < 100 and 0 <= b < 100
        expected = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else None}[op]
        assert p.target == str(expected)
        assert int(p.target) >= 0  # subtraction is ordered
        if op == "/":
            assert b >= 1 and a % b == 0  # exact division


def test_heldout_is_fixed_sized_distinct_and_reproducible():
    task = ArithmeticTask(digits=2, ops="+", eval_size=256)
    heldout = task.heldout()
    assert len(heldout) == 256 and len({p.prompt for p in heldout}) == 256
    again = ArithmeticTask(digits=2, ops="+", eval_size=256).heldout()
    assert [p.prompt for p in again] == [p.prompt for p in heldout]
    assert [p.prompt for p in heldout[:100]] == [p.prompt for p in ArithmeticTask(eval_size=100).heldout()]


@pytest.mark.parametrize("ops", ["+", "+-*"])
def test_training_stream_never_yields_a_heldout_problem(ops):
    task = ArithmeticTask(digits=2, ops=ops, eval_size=200)
    heldout = {p.question for p in task.heldout()}
    train = [p.question for p in itertools.islice(task.train_stream(seed=0), 30_000)]
    assert not heldout & set(train)
    # disjoint by construction: nothing from the held-out bucket, and the bucket is a real share of the space
    assert all(not task.is_heldout(*split(q)) for q in train[:3000])
    assert all(task.is_heldout(*split(q)) for q in heldout)
    assert len(set(train)) > 3000


def split(question):
    for op in "+-*/":
        if op in question:
            a, b = question.split(op)
            return int(a), op, int(b)
    raise AssertionError(question)


def test_train_stream_is_seeded():
    task = ArithmeticTask()
    first = [p.prompt for p in itertools.islice(task.train_stream(1), 50)]
    assert first == [p.prompt for p in itertools.islice(task.train_stream(1), 50)]
    assert first != [p.prompt for p in itertools.islice(task.train_stream(2), 50)]


def test_held_out_size_limits():
    """(The ranges of digits, ops and eval_size are the schema's: tests/config/test_errors.py.)"""
    assert max_eval_size(1, "+") == 3  # 100 problems, 1/8 of them held out, a quarter of that kept
    assert ArithmeticTask(eval_size=0).heldout() == []
    with pytest.raises(ValueError, match="distinct held-out problems"):
        ArithmeticTask(digits=2, ops="/", eval_size=200).heldout()


def test_the_source_interface():
    task = ArithmeticTask(eval_size=5, seed=3)
    factory, heldout = task.problems()
    assert heldout == task.eval_problems() == task.heldout() and len(heldout) == 5
    assert [p.prompt for p in itertools.islice(factory(), 5)] == [
        p.prompt for p in itertools.islice(task.train_stream(3), 5)]
