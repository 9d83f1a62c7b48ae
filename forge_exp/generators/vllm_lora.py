"""LoRA on the vLLM generator (model.lora; models/lora.py): every weight push carries the adapter alone, which is
written in peft's format (adapter_config.json + adapter_model.safetensors, as vLLM loads adapters) and added to the
engine as a new adapter, `LoRARequest` id = version + 1 (vLLM's own multi-LoRA path, `enable_lora`). Requests sent
after a push use its adapter; a request in flight keeps the adapter it started with, so all of a completion's tokens
come from one version (the base weights never change). vLLM keeps `max_loras` adapters on the device; the newest
KEEP adapter directories stay on disk, so it can reload one it evicted while a request of it still runs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterable

import torch

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig.max_lora_rank takes these
KEEP = 4  # adapter directories kept (a request may still use an older version's)


class VllmAdapters:
    def __init__(self, lora, skeleton: torch.nn.Module):
        """`lora`: models.lora.Lora; `skeleton`: the base model's modules (meta), for the default targets."""
        if lora.rank > RANKS[-1]:
            raise ValueError(f"model.lora.rank={lora.rank}: vLLM serves adapters of rank <= {RANKS[-1]}")
        self.lora, self.config = lora, lora.peft_config(skeleton)
        self.root = Path(tempfile.mkdtemp(prefix="forge-exp-lora-"))
        self.request = None  # the newest adapter's LoRARequest: what new requests are sent with
        self.version = 0  # its weights version

    def engine_args(self) -> dict:
        # two on the device: the newest and the one requests in flight may still use
        return {"enable_lora": True, "max_lora_rank": next(r for r in RANKS if r >= self.lora.rank), "max_loras": 2}

    def write(self, weights: Iterable[tuple[str, torch.Tensor]], version: int):
        """The adapter of `version` on disk, and the LoRARequest that adds it."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        directory = self.root / f"v{version}"
        directory.mkdir()
        save_file({n: t.detach().to("cpu").contiguous() for n, t in weights}, str(directory / "adapter_model.safetensors"))
        self.config.save_pretrained(str(directory))
        return LoRARequest(f"forge-exp-v{version}", version + 1, str(directory))

    def serving(self, request, version: int) -> None:
        """`request` is in the engine: new requests use it; directories older than the KEEP newest go."""
        self.request, self.version = request, version
        for old in sorted(self.root.iterdir(), key=lambda p: int(p.name[1:]))[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
