"""Per-token log-probabilities and entropies of responses under a causal LM (the trainer's side of the ratio).

Layout follows `rl.types.TrainBatch`: prompts left-padded to P, responses right-padded to R, so every response
starts at column P of `[prompt | response]`. Position ids count real tokens only, which makes them equal to the
generator's positions for the same row (see models/generate.py), so the recomputed logprobs match the behaviour
logprobs for the same weights. Logprobs and entropies are of the temperature-scaled distribution
`softmax(logits / T)`; T == 0 (greedy) is treated as T = 1, as in the generator.
"""

from __future__ import annotations
from typing import TYPE_CHECKING

import torch

from forge_exp.models.generate import positions_from_mask

if TYPE_CHECKING:  # only annotations here: the modeling code loads with the model (models/hf.py)
    from transformers import PreTrainedModel


def sequence_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [B, P] long, left-padded
    prompt_mask: torch.Tensor,  # [B, P] bool
    response_ids: torch.Tensor,  # [B, R] long, right-padded
    response_mask: torch.Tensor,  # [B, R] bool
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(logprobs [B, R], entropy [B, R])` in float32; both are 0 where response_mask is False.

    Differentiable (call under torch.no_grad() for reference/old-policy logprobs). Only the R positions that predict
    response tokens go through the LM head, so memory is O(B·R·V), not O(B·(P+R)·V).
    TODO(researcher): for 150k-token vocabularies and long responses, chunk over R here to bound the [B, R, V] buffer.
    """
    response_len = response_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1).bool()
    positions = positions_from_mask(mask)
    # The logits at column t predict token t+1: columns P-1 .. P+R-2 predict the R response tokens.
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=response_len + 1
    )
    logits = out.logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, R, V]
    token_logprobs = log_probs.gather(-1, response_ids[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    keep = response_mask.bool()
    return token_logprobs.masked_fill(~keep, 0.0), entropy.masked_fill(~keep, 0.0)
