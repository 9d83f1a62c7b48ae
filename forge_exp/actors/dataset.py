"""Dataset service: the training prompt stream and the fixed held-out set."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_exp.rl.types import Problem
from forge_exp.runtime.build import build


class DatasetService(Actor):
    def __init__(self, dataset, model, *, devices, threads):
        train_factory, self.heldout = build(dataset, "dataset").problems(build(model, "model").tokenizer())
        self.train = iter(train_factory())

    @endpoint
    async def sample(self, n: int) -> list[Problem]:
        return [next(self.train) for _ in range(n)]

    @endpoint
    async def eval_problems(self) -> list[Problem]:
        return self.heldout
