"""Where an actor puts itself: its device from the [replica][proc] table the runtime passes, and its threads."""

from __future__ import annotations

import torch
import transformers
from monarch.actor import current_rank


def my_devices(devices: list[list[str]]) -> list[str]:
    """This process's devices: its own one, or, when one process drives its replica's devices itself (a vLLM
    engine's tensor-parallel workers: the mesh then has one proc per replica), all of its replica's."""
    point = current_rank()  # (read while the actor is being constructed: it has the mesh's coordinates then)
    labels = list(point.keys())
    replica = devices[point["replicas"] if "replicas" in labels else 0]
    procs = point.size("procs") if "procs" in labels else 1
    return replica if procs == 1 and len(replica) > 1 else [replica[point["procs"] if "procs" in labels else 0]]


def own_visible_devices(devices: list[list[str]]) -> tuple[list[list[str]], int]:
    """For an engine that starts its own workers on the visible GPUs from index 0 (vLLM): make this replica's GPUs
    the only visible ones (before CUDA starts in this process) and renumber them; returns (devices, how many)."""
    import os

    mine = my_devices(devices)
    if torch.device(mine[0]).type == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(torch.device(d).index) for d in mine)
        mine = [f"cuda:{i}" for i in range(len(mine))]
    return [mine], len(mine)


def place(devices: list[list[str]], threads: int, seed: int | None = None) -> torch.device:
    transformers.utils.logging.disable_progress_bar()  # no per-actor "Loading weights" bars over the run's own
    device = torch.device(my_devices(devices)[0])
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if seed is not None:
        torch.manual_seed(seed + current_rank().rank)
    return device
