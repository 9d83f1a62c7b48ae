"""The one sampler every generation path uses: schedule-independent draws and full-distribution logprobs.

Draws. Row r of a call with seed s draws its token at step t by inverse-CDF sampling with one uniform number
u = hash(key(s, r), t) — counter-based noise (a murmur3-style 32-bit mixer over int64 tensors), not a shared
`torch.Generator` stream. So a row's tokens depend only on its own key, its step and its logits: not on which other
rows share its batch, in which order requests arrived, or whether the engine batches continuously. The eager path
(models/generate.py) and the native engine use this same function, which is what makes them comparable token for
token. u has 24 bits, so the smallest mass the draw resolves is 2**-24 (about 6e-8).

Logprobs. The behaviour logprob of a sampled token is log_softmax(logits / T) of the full vocabulary, before top-p
truncation; for T == 0 (greedy) it is log_softmax(logits), T = 1 (see models/generate.py for why).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

M32 = 0xFFFFFFFF


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding values in [0, 2**32). A product may wrap past 2**63;
    its low 32 bits, all that the mask keeps, are still exact."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def _fmix32_int(h: int) -> int:
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def row_key(seed: int, row: int) -> int:
    """The noise key of row `row` of a call seeded `seed` (any Python int). Distinct rows of one seed get distinct
    keys: each step of the mix is a bijection of 32-bit values."""
    s = _fmix32_int((seed & M32) ^ _fmix32_int(((seed >> 32) & M32) + 0x3C6EF372))
    return _fmix32_int(s ^ ((row * 0x9E3779B9 + 0xBB67AE85) & M32))


def derive_seed(*parts: int | str) -> int:
    """A call seed made of `parts` (a run's seed, a batch, a call index...): the same in every process, run and
    schedule, unlike Python's salted hash(); 62 bits."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def uniform(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """u in [0, 1), float32 [B], from keys [B] long and steps [B] long (the index of the token being drawn)."""
    h = _fmix32(keys ^ _fmix32((steps * 0x9E3779B9 + 0x632BE5AB) & M32))
    return (h >> 8).to(torch.float32) * 2.0**-24


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index [B] of the first column whose running mass exceeds u * total, for probs [B, V] >= 0 and u [B] in [0, 1).
    The target is held strictly below the total, so the index always lands on a column of positive mass."""
    cdf = probs.cumsum(-1)  # [B, V], non-decreasing
    total = cdf[:, -1:]
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def sample(
    logits: torch.Tensor,  # [B, V] float32
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    top_p: torch.Tensor,  # [B] float32 in (0, 1]
    keys: torch.Tensor,  # [B] long, row_key of each row
    steps: torch.Tensor,  # [B] long, index of the token being drawn
    truncate: bool,  # whether any row has top_p < 1 (a host-side flag: it selects code, never data)
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: `(tokens [B] long, logprobs [B] float32)`. No host sync: safe inside a CUDA graph.

    Each row's result depends on its own inputs only. With `truncate`, rows whose top_p is 1 still take the
    untruncated draw, so a row does not change when a top-p row joins its batch.
    """
    greedy = temperature == 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    log_probs = torch.log_softmax(logits / scale[:, None], -1)  # [B, V]
    probs = log_probs.exp()
    u = uniform(keys, steps)
    tokens = _inverse_cdf(probs, u)
    if truncate:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p[:, None]
        picked = order.gather(-1, _inverse_cdf(sorted_probs.masked_fill(drop, 0.0), u)[:, None]).squeeze(-1)
        tokens = torch.where(top_p < 1, picked, tokens)
    tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


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
