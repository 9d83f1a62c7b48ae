"""`generator=torch`: batched sampling over the transformers model with a KV cache (models/generate.py), one
batch at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import torch

from forge_exp.generators.base import Generation, Sampling
from forge_exp.models.generate import generate
from forge_exp.models.hf import ModelSpec


class TorchEngine:
    def __init__(self, model: ModelSpec, device: torch.device, seed: int):
        self.model = model.build(device)
        self.model.eval()
        self.tokenizer = model.tokenizer()
        self.device = device
        self._rng = torch.Generator(device=device).manual_seed(seed)
        self._lock = asyncio.Lock()  # one batch at a time: weights load between batches

    async def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]:
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompts, sampling)

    def _generate(self, prompts: list[list[int]], s: Sampling) -> list[list[Generation]]:
        rows = [ids for ids in prompts for _ in range(s.n)]
        outs = generate(self.model, rows, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                        eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id, generator=self._rng)
        return [outs[i * s.n : (i + 1) * s.n] for i in range(len(prompts))]

    def parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = self.parameters()
        names, sources = zip(*weights)
        torch._foreach_copy_([params[n].detach() for n in names], list(sources), non_blocking=True)

    def close(self) -> None:
        pass
