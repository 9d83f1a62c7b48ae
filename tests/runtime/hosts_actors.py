"""Actors for tests/runtime/test_hosts.py (a module of its own: Monarch's actor processes import it by name)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from monarch.actor import Actor, current_rank, endpoint

from forge_exp.actors.placement import my_devices


class WhereAmI(Actor):
    """Placed like a service actor (it receives `devices` and `threads`); says which replica, devices and process."""

    def __init__(self, devices: list[list[str]], threads: int):
        point = current_rank()
        self.replica = point["replicas"]
        self.devices = my_devices(devices)

    @endpoint
    async def where(self) -> dict:
        return {"replica": self.replica, "devices": self.devices, "pid": os.getpid(), "parent": os.getppid()}


class RankProbe(Actor):
    """A collective's process: its torch.distributed rank, the world's all_reduce, and the torchrun variables."""

    def __init__(self, devices: list[list[str]], threads: int):
        self.devices = my_devices(devices)

    @endpoint
    async def ranks(self) -> dict:
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": float(t),
                "local_rank": int(os.environ["LOCAL_RANK"]), "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
                "devices": self.devices, "parent": os.getppid()}
