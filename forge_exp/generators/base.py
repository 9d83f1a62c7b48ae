"""The interface every generation backend implements, and the two value types it speaks in.

An engine is built as `Engine(model, device, seed, **knobs)`: `model` is a `forge_exp.config.model.ModelConfig`,
`knobs` are the keys of the engine's YAML node (each backend checks its own and names a wrong one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class Sampling:
    """How to sample the completions of one `generate` call.

    `seed` is optional: when set, the draws of this call are fixed by it (row r = prompt_index * n + sample_index
    draws its token at step t from noise keyed by (seed, r, t)), whatever else the engine batches with it; when None
    the engine takes the next seed of its own stream.
    """

    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # keep 1 for RL (see models/generate.py on behaviour logprobs under top-p)
    max_new_tokens: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"sampling n (completions per prompt) must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"sampling max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"sampling temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p must be in (0, 1], got {self.top_p}")


class Generation(NamedTuple):
    token_ids: list[int]  # sampled tokens, the EOS token included when the row stopped on it
    logprobs: list[float]  # behaviour logprob of each token in token_ids: log_softmax(logits / T), full vocabulary
    stop_reason: str  # "eos" | "length"


@runtime_checkable
class Engine(Protocol):
    tokenizer: object  # the model's transformers tokenizer

    async def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Generation]]:
        """`sampling.n` completions of every prompt (token ids, each at least one token): result[prompt][sample].
        Many calls may be in flight at once; the engine batches their rows together."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights in, by HF parameter name. Applied between decode steps: rows in flight continue under
        the new weights. Returns once they are in place (the caller may then reuse its buffers)."""
        ...

    def close(self) -> None:
        """Stop the engine; calls still waiting fail."""
        ...
