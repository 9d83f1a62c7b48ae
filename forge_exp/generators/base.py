"""The interface every generation engine implements; the generator actor (actors/generator.py) holds one.

    engine = Engine(model, device, seed, **knobs)          # built from conf/generator/<name>.yaml
    groups = await engine.generate(prompt_ids, sampling)   # [prompt][n] Generations; calls may overlap
    engine.load_weights(named_tensors)                     # HF parameter names; applies between decode steps
    engine.close()

Behaviour logprobs are `log_softmax(logits / T)` of the full distribution (see models/generate.py), the contract
the trainer recomputes, whatever the engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from forge_exp.models.generate import Generation  # noqa: F401 — re-exported: one completion's tokens and logprobs


@dataclass(frozen=True)
class Sampling:
    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 512


class Engine(Protocol):
    tokenizer: Any

    async def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def parameters(self) -> dict[str, torch.Tensor]: ...  # HF names → tensors (shapes for the weight layout)

    def close(self) -> None: ...
