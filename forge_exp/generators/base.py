"""The interface every generation backend implements, and the two value types it speaks in.

An engine is built as `Engine(model, device, seed, **knobs)`: `model` is a `forge_exp.models.hf.ModelSpec` (what
conf/model/ builds), `knobs` are the keys of the engine's YAML node (conf/generator/), parsed into its own schema
(generators/options.py).
"""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

import torch

from forge_exp.models.generate import Generation  # noqa: F401 — one completion's tokens and logprobs
from forge_exp.models.sampling import Sampling  # noqa: F401 — how one call samples


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
