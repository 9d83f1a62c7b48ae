"""The driver's `generate` over a model in this process (forge_exp/models/generate.py): for scripts, tests and the
generator actor's token-level endpoint.

    generate = local_generate(model, tokenizer, stop_ids=chat_format.stop_ids(tokenizer), generator=rng)
    outs = await generate(prompts, Sampling(n=8, temperature=1.0, max_new_tokens=24))   # [len(prompts)][8]
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from forge_exp.envs.driver import GenerateFn
from forge_exp.envs.types import Sampling
from forge_exp.models.generate import Generation, generate


def local_generate(
    model, tokenizer, *, stop_ids: Sequence[int] | None = None, generator: torch.Generator | None = None
) -> GenerateFn:
    stops = list(stop_ids) if stop_ids else [tokenizer.eos_token_id]

    def run(prompts: list[list[int]], s: Sampling) -> list[list[Generation]]:
        rows = [p for p in prompts for _ in range(s.n)]
        outs = generate(
            model, rows, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
            eos_id=stops, pad_id=tokenizer.pad_token_id, generator=generator,
        )
        return [outs[i * s.n : (i + 1) * s.n] for i in range(len(prompts))]

    async def call(prompts: list[list[int]], s: Sampling) -> list[list[Generation]]:
        return await asyncio.to_thread(run, prompts, s)  # the loop stays free for environment steps

    return call
