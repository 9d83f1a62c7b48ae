"""Dataset service: the training prompt stream and the fixed held-out set. `state()` / `restore()` carry the
stream's position through a checkpoint, so a resumed run continues with the prompts the interrupted one had not
reached: a file's (epoch, row) where the source tracks it (data/hf.py), else the count of problems drawn, replayed."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from monarch.actor import Actor, endpoint

from forge_exp.rl.types import Problem
from forge_exp.runtime.build import build


class DatasetService(Actor):
    def __init__(self, dataset, model, *, devices, threads):
        self.factory, self.heldout = build(dataset, "dataset").problems(build(model, "model").tokenizer())
        self.train = Draws(self.factory())
        self.drawn = 0

    @endpoint
    async def sample(self, n: int) -> list[Problem]:
        problems = self.train.take(n)
        self.drawn += n
        return problems

    @endpoint
    async def skip(self, n: int) -> None:
        """Draw n problems and drop them here (a warm start's share of the stream, 76,800 at the tiny default's
        settings: sending them back would cost more than drawing them)."""
        self.train.drop(n)
        self.drawn += n

    @endpoint
    async def eval_problems(self) -> list[Problem]:
        return self.heldout

    @endpoint
    async def state(self) -> dict:
        position = getattr(self.factory, "position", None)
        return {"drawn": self.drawn, "position": list(position) if position is not None else None,
                "bad_rows": getattr(self.factory, "bad_rows", None)}  # skipped by this process (dataset.bad_rows)

    @endpoint
    async def restore(self, state: dict) -> None:
        if state.get("position") is not None and hasattr(self.factory, "position"):
            self.train = Draws(self.factory(*state["position"]))
        else:  # a seeded stream without a position (the synthetic task): draw as many again
            self.train = Draws(self.factory())
            self.train.drop(state["drawn"])
        self.drawn = state["drawn"]


class Draws:
    """The endless prompt stream, drawn n at a time. Once the stream has raised (a bad row, no usable row), every
    later draw raises that same error: a generator that raised is over, so the draw of a batch generating beside the
    one that met the row would otherwise fail with a bare StopIteration and could be the failure the run reports."""

    def __init__(self, stream: Iterator[Problem]):
        self.stream, self.error, self.traceback = iter(stream), None, None

    def take(self, n: int) -> list[Problem]:
        return list(self._draw(n))

    def drop(self, n: int) -> None:
        """Draw n problems and keep none."""
        deque(self._draw(n), maxlen=0)

    def _draw(self, n: int) -> Iterator[Problem]:
        if self.error is not None:  # with its first traceback, not one grown by every raise
            raise self.error.with_traceback(self.traceback)
        try:
            for _ in range(n):
                yield next(self.stream)
        except StopIteration:
            self.error = RuntimeError("the prompt stream ended (it is endless unless its source failed)")
            raise self.error from None
        except Exception as e:
            self.error, self.traceback = e, e.__traceback__
            raise
