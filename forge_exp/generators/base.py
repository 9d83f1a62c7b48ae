"""The interface every generation backend implements, and the two value types it speaks in.

An engine is built as `Engine(model, device, seed, **knobs)`: `model` is a `forge_exp.models.hf.ModelSpec` (what
conf/model/ builds), `knobs` are the keys of the engine's YAML node (conf/generator/, typed by config/backends.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import torch

from forge_exp.models.generate import Generation  # noqa: F401 — one completion's tokens and logprobs


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

    def parameters(self) -> dict[str, torch.Tensor]:
        """The weights by HF parameter name (tied ones once): what the trainer's weights are checked against."""
        ...

    def close(self) -> None:
        """Stop the engine; calls still waiting fail."""
        ...
