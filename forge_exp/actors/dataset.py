"""Dataset service: the training prompt stream and the fixed held-out set. `state()` / `restore()` carry the
stream's position through a checkpoint, so a resumed run continues with the prompts the interrupted one had not
reached: a file's (epoch, row) where the source tracks it (data/hf.py), else the count of problems drawn, replayed."""

from __future__ import annotations

import itertools
from collections import deque

from monarch.actor import Actor, endpoint

from forge_exp.rl.types import Problem
from forge_exp.runtime.build import build


class DatasetService(Actor):
    def __init__(self, dataset, model, *, devices, threads):
        self.factory, self.heldout = build(dataset, "dataset").problems(build(model, "model").tokenizer())
        self.train = iter(self.factory())
        self.drawn = 0

    @endpoint
    async def sample(self, n: int) -> list[Problem]:
        problems = [next(self.train) for _ in range(n)]
        self.drawn += n
        return problems

    @endpoint
    async def skip(self, n: int) -> None:
        """Draw n problems and drop them here (a warm start's share of the stream, 76,800 at the tiny default's
        settings: sending them back would cost more than drawing them)."""
        drop(self.train, n)
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
            self.train = iter(self.factory(*state["position"]))
        else:  # a seeded stream without a position (the synthetic task): draw as many again
            self.train = iter(self.factory())
            drop(self.train, state["drawn"])
        self.drawn = state["drawn"]


def drop(stream, n: int) -> None:
    """Draw n items of `stream` and keep none."""
    deque(itertools.islice(stream, n), maxlen=0)
