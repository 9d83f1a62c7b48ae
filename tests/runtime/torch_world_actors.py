"""An actor that runs collectives in the torch.distributed world set up by runtime/torch_world.py.
(A module of its own: Monarch's actor processes import it by name.)"""

from __future__ import annotations

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint


class WorldProbe(Actor):
    @endpoint
    async def all_reduce(self) -> tuple[int, int, float]:
        """(rank, world size, sum over ranks of rank + 1)."""
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), float(t)

    @endpoint
    async def parity(self, checkpoint: str, batches: str) -> list | None:
        """The FSDP parity run of tests/trainers on this world; rank 0 returns its record."""
        from tests.trainers.titan_cases import parity_job

        torch.set_num_threads(1)
        steps = parity_job(checkpoint, batches, "fsdp", 1)
        return steps if dist.get_rank() == 0 else None
