"""Where an actor puts itself: its device from the [replica][proc] table the runtime passes, and its threads."""

from __future__ import annotations

import torch
import transformers
from monarch.actor import current_rank


def place(devices: list[list[str]], threads: int, seed: int | None = None) -> torch.device:
    transformers.utils.logging.disable_progress_bar()  # no per-actor "Loading weights" bars over the run's own
    flat = [d for replica in devices for d in replica]
    device = torch.device(flat[current_rank().rank])
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if seed is not None:
        torch.manual_seed(seed + current_rank().rank)
    return device
