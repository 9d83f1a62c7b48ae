"""A torch.distributed world over the processes of a Monarch proc mesh (no torchrun), for the sharded trainer.

    world = await init_torch_world(procs, backend="gloo")   # or "nccl", devices=[...] one per process
    trainers = procs.spawn("trainer", Trainer, ...)         # actors on these processes find the world initialised
    ...
    await close_torch_world(world)                          # before procs.stop()

Rendezvous: rank 0 opens a TCPStore on port 0, so the operating system picks a free port and the store holds it
from bind to the end of the run; the controller hands (host, port) to the other ranks through Monarch. No port is
guessed or probed (monarch.spmd's `setup_torch_elastic_env` finds a free port and releases it before torch binds
it, which two concurrent runs can race for), and each world's keys carry a fresh run id. Ranks, world size and
local rank come from each process's place in the mesh (`monarch.actor.current_rank`), as torchrun's variables
would; they are also exported (RANK, WORLD_SIZE, LOCAL_RANK, ...) for libraries that read them.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from monarch.actor import Actor, current_rank, current_size, endpoint


class TorchWorld(Actor):
    """One per process of the mesh: joins (and later leaves) the process's default torch.distributed group."""

    def __init__(self, local_world_size: int | None = None):
        point, sizes = current_rank(), current_size()  # at spawn: this process's place in the whole mesh
        self.rank = point.rank
        self.world_size = math.prod(sizes.values())
        # processes of one host: the innermost dimension ("procs"), unless the mesh spans hosts (runtime/hosts.py:
        # ranks are hosts-major, `local_world_size` per host)
        self.local_world_size = local_world_size or sizes[point.extent.labels[-1]]
        self.local_rank = self.rank % self.local_world_size
        self._store: dist.TCPStore | None = None

    @endpoint
    async def open_store(self, timeout_s: float) -> tuple[str, int] | None:
        """Rank 0: start the rendezvous store on a port the OS assigns; returns (host, port). Others: None."""
        if self.rank != 0:
            return None
        self._store = dist.TCPStore(
            socket.gethostname(), 0, self.world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        return socket.gethostname(), self._store.port

    @endpoint
    async def init(self, host: str, port: int, backend: str, run_id: str, devices: list[str] | None,
                   timeout_s: float) -> dict[str, Any]:
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed world (init_torch_world twice?)")
        timeout = timedelta(seconds=timeout_s)
        store = self._store or dist.TCPStore(host, port, self.world_size, is_master=False, timeout=timeout)
        self._store = store
        os.environ.update(
            RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.local_world_size), MASTER_ADDR=host, MASTER_PORT=str(port),
        )
        device = None
        if devices is not None:
            device = torch.device(devices[self.rank])
            if device.type == "cuda":
                torch.cuda.set_device(device)
        dist.init_process_group(
            backend, store=dist.PrefixStore(run_id, store), rank=self.rank, world_size=self.world_size,
            timeout=timeout, **({"device_id": device} if device is not None and device.type == "cuda" else {}),
        )
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": dist.get_backend()}

    @endpoint
    async def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None


async def init_torch_world(
    procs: Any, backend: str = "gloo", devices: list[str] | None = None, timeout_s: float = 300.0,
    local_world_size: int | None = None,
) -> Any:
    """Initialise one torch.distributed world over every process of the Monarch proc mesh `procs`; returns the
    TorchWorld actor mesh (keep it for `close_torch_world`). `devices`: one device string per process, in rank
    order, set as each process's CUDA device (nccl). `local_world_size`: processes per host, when the mesh spans
    hosts (default: the size of its innermost dimension)."""
    world = procs.spawn("torch_world", TorchWorld, local_world_size)
    addresses = [a for a in (await world.open_store.call(timeout_s)).values() if a is not None]
    if len(addresses) != 1:
        raise RuntimeError(f"expected one rendezvous store (rank 0), got {len(addresses)}")
    host, port = addresses[0]
    run_id = uuid.uuid4().hex
    ranks = list((await world.init.call(host, port, backend, run_id, devices, timeout_s)).values())
    if sorted(r["rank"] for r in ranks) != list(range(len(ranks))):
        raise RuntimeError(f"torch.distributed ranks do not cover the mesh: {ranks}")
    return world


async def close_torch_world(world: Any) -> None:
    await world.close.call()
