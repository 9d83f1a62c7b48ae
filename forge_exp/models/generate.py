"""Eager batched sampling over any causal LM (transformers', or models/qwen3.py's), with a KV cache: the reference path.

The prompts are left-padded into one batch and prefilled once; then every step feeds one token per row and reuses
the cache (transformers' `DynamicCache`, or the model's own), so a step costs one token of compute, not a full
recompute. Each row stops on its own at EOS or after `max_new_tokens`; the batch ends when every row has stopped.
Tokens are drawn by the shared sampler (`models/sampling.py`, noise keyed by (seed, row, step)), so the native engine
(`generators/native.py`) reproduces this function token for token; that engine is the fast path.

Behaviour logprobs — the choice the trainer depends on. The logprob returned for a sampled token is its
log-softmax under the *temperature-scaled full* distribution, `log_softmax(logits / T)`, before any top-p
truncation. That is exactly what `models.logprobs.sequence_logprobs` recomputes on the trainer, so the importance
ratio is 1 for on-policy data and the PPO clip sees only real policy drift. The price: with top_p < 1 the tokens
were actually drawn from the truncated, renormalised distribution, so for them the ratio is off by the kept mass
(keep top_p = 1 for RL, the default). With temperature == 0 decoding is greedy and the logprob is taken under the
unscaled distribution (T = 1), as `sequence_logprobs` does for T = 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import TYPE_CHECKING, NamedTuple

import torch

from forge_exp.models.sampling import row_key, sample

if TYPE_CHECKING:  # only annotations here: the modeling code loads with the model (models/hf.py)
    from transformers import PreTrainedModel


class Generation(NamedTuple):
    token_ids: list[int]  # sampled tokens, the EOS token included when the row stopped on it
    logprobs: list[float]  # behaviour logprob of each token in token_ids: log_softmax(logits / T), full vocabulary
    stop_reason: str  # "eos" | "length"
    policy_version: int | None = None  # the weights version it started under (set by the generator service)

__all__ = ["Generation", "generate", "left_pad", "positions_from_mask"]


def left_pad(
    rows: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows into `(ids [B, P] long, mask [B, P] bool)`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = True
    return ids.to(device), mask.to(device)


def _new_cache(model: PreTrainedModel):
    """An empty KV cache for `model`: its own where it brings one (models/qwen3.py), else transformers'."""
    if hasattr(model, "new_cache"):
        return model.new_cache()
    from transformers import DynamicCache  # here, not at the top: importing this module loads no modeling code

    return DynamicCache(config=model.config)


def _cache_arg(model: PreTrainedModel) -> str:
    """transformers >= 5.24 names the KV-cache argument `cache` (`past_key_values` is deprecated there); older
    releases, such as a GPU image's, only know `past_key_values`. Passing the wrong name would silently drop the cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, T] that start at 0 on each row's first real token (pad positions get 0; they are masked)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_id: int | Collection[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> list[Generation]:
    """Sample a continuation of every prompt in one batch; one `Generation` per prompt, in order.

    To draw a group of n samples per prompt, repeat the prompt n times in `prompt_ids`. Row r draws with the key
    (seed, r); without `seed` one is drawn from `generator` (or torch's global generator when that is None too).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got temperature={temperature}, top_p={top_p}")
    if not prompt_ids:
        return []
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (encode with a <bos> token)")
    device = next(model.parameters()).device
    if seed is None:
        where = generator.device if generator is not None else "cpu"
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=where))
    eos = torch.tensor(sorted({eos_id} if isinstance(eos_id, int) else set(eos_id)), dtype=torch.long, device=device)
    ids, mask = left_pad(prompt_ids, pad_id, device)
    batch = ids.shape[0]
    positions = positions_from_mask(mask)
    keys = torch.tensor([row_key(seed, r) for r in range(batch)], dtype=torch.long, device=device)
    temperatures = torch.full((batch,), float(temperature), device=device)
    top_ps = torch.full((batch,), float(top_p), device=device)

    cache = {_cache_arg(model): _new_cache(model)}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float()
    next_pos = positions[:, -1:] + 1  # [B, 1]

    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        steps = torch.full((batch,), step, dtype=torch.long, device=device)
        tok, lp = sample(logits, temperatures, top_ps, keys, steps, truncate=top_p < 1)
        tok = tok.masked_fill(done, pad_id)  # rows that stopped keep feeding pad; their output is discarded
        tokens[:, step] = tok
        logprobs[:, step] = lp
        hit_eos = ~done & (tok[:, None] == eos).any(-1)
        lengths[hit_eos] = step + 1
        done |= hit_eos
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.bool, device=device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, **cache, use_cache=True)
        logits = out.logits[:, -1].float()
        next_pos = next_pos + 1

    tokens_l, logprobs_l, lengths_l, eos_l = tokens.tolist(), logprobs.tolist(), lengths.tolist(), done.tolist()
    return [
        Generation(tokens_l[i][: lengths_l[i]], logprobs_l[i][: lengths_l[i]], "eos" if eos_l[i] else "length")
        for i in range(batch)
    ]
