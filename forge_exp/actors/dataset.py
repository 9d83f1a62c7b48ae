"""Dataset service: the training prompt stream and the fixed held-out set."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_exp.config.dataset import DatasetConfig, build_dataset
from forge_exp.config.model import ModelConfig, build_tokenizer
from forge_exp.rl.types import Problem


class DatasetService(Actor):
    def __init__(self, dataset: DatasetConfig, model: ModelConfig, *, devices, threads):
        train_factory, self.heldout = build_dataset(dataset, build_tokenizer(model))
        self.train = iter(train_factory())

    @endpoint
    async def sample(self, n: int) -> list[Problem]:
        return [next(self.train) for _ in range(n)]

    @endpoint
    async def eval_problems(self) -> list[Problem]:
        return self.heldout
