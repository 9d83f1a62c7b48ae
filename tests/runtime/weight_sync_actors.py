"""Trainer and generator with two extra endpoints each, so tests can see the weights a generator holds.
(A module of its own: Monarch's actor processes import it by name.)"""

from __future__ import annotations

import torch
from monarch.actor import endpoint

from forge_exp.actors.generator import Generator
from forge_exp.actors.trainer import Trainer


def digest(model: torch.nn.Module) -> list[float]:
    """One float64 sum per parameter: equal lists mean equal weights here (the copies are bitwise)."""
    return [float(p.detach().double().sum()) for _, p in model.named_parameters()]


class ProbeTrainer(Trainer):
    @endpoint
    async def perturb(self, scale: float) -> int:
        """Stands in for a training step: every weight moves, the version goes up by one."""
        with torch.no_grad():
            for p in self.engine.model.parameters():
                p.add_(torch.randn_like(p) * scale)
        self.version += 1
        return self.version

    @endpoint
    async def digest(self) -> list[float]:
        return digest(self.engine.model)


class ProbeGenerator(Generator):
    @endpoint
    async def digest(self) -> list[float]:
        return digest(self.engine.model)

    @endpoint
    async def transport(self) -> str | None:
        receiver = getattr(self, "_receiver", None)
        return receiver.transport if receiver else None
