"""The dataset service's stream: a failed stream keeps failing with its own error, never a bare StopIteration."""

import traceback

import pytest

from forge_exp.actors.dataset import Draws


def rows(bad_at: int):
    """Problems 1, 2, ... as text; at `bad_at` the stream raises, as data/hf.py does at a bad row."""
    n = 0
    while True:
        n += 1
        if n == bad_at:
            raise ValueError(f"train.jsonl row {n}: bad")
        yield str(n)


def test_draws_take_and_drop_in_order():
    d = Draws(rows(bad_at=0))
    assert d.take(2) == ["1", "2"]
    d.drop(3)
    assert d.take(1) == ["6"]


def test_every_draw_after_the_stream_failed_raises_its_error():
    d = Draws(rows(bad_at=4))
    assert d.take(2) == ["1", "2"]
    with pytest.raises(ValueError, match="row 4: bad"):
        d.take(3)  # the first batch to meet the row
    depths = []
    for draw in (lambda: d.take(1), lambda: d.drop(1), lambda: d.take(1)):  # batches drawing beside it
        with pytest.raises(ValueError, match="row 4: bad") as raised:
            draw()
        depths.append(len(traceback.extract_tb(raised.value.__traceback__)))
    assert depths[0] == depths[2]  # each raise starts from the first traceback, not one grown by every raise


def test_a_stream_that_ends_says_so():
    d = Draws(iter(["1"]))
    with pytest.raises(RuntimeError, match="prompt stream ended"):
        d.take(2)
    with pytest.raises(RuntimeError, match="prompt stream ended"):
        d.take(1)
