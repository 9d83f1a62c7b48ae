"""The interface every generation engine implements; the Generator actor only ever talks to this.

An engine turns prompts (token ids) into `Generation`s with behaviour logprobs (the contract is in the docstring
of forge_exp/models/generate.py: `log_softmax(logits / T)` of the full distribution), many `generate` calls in
flight at once, and takes new weights by HF parameter name without restarting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from forge_exp.models.generate import Generation

__all__ = ["Engine", "Generation", "Sampling"]


@dataclass(frozen=True)
class Sampling:
    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got n={self.n}, max_new_tokens={self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"need temperature >= 0 and 0 < top_p <= 1, got temperature={self.temperature}, top_p={self.top_p}"
            )


class Engine(Protocol):
    tokenizer: object  # a transformers tokenizer (encode/decode, eos_token_id, pad_token_id)

    async def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]:
        """`sampling.n` generations of every prompt: result[i][j] is the j-th sample of prompts[i]."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Apply new weights (HF parameter names) without restarting; requests in flight are kept."""
        ...

    def close(self) -> None: ...
