"""Episodes → TrainBatch tensors: prompts left-padded, responses right-padded, and the loss mask (the model's own
tokens: all response tokens of a single-turn completion, only the model's turns of a multi-turn episode)."""

from __future__ import annotations

import torch

from forge_exp.models.generate import left_pad
from forge_exp.rl.types import Episode, TrainBatch


def pad_right(rows: list[list], pad, dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
            mask[i, : len(r)] = True
    return out, mask


def collate_episodes(episodes: list[Episode], pad_id: int) -> TrainBatch:
    completions = [e.completion for e in episodes]
    prompt_ids, prompt_mask = left_pad([c.prompt_ids for c in completions], pad_id)
    response_ids, response_mask = pad_right([c.token_ids for c in completions], pad_id)
    behavior, _ = pad_right([c.logprobs for c in completions], 0.0, dtype=torch.float32)
    loss_mask = response_mask.clone()
    for i, c in enumerate(completions):
        if c.loss_mask is not None:  # environment tokens are context, not something the model chose
            loss_mask[i, : len(c.loss_mask)] = torch.tensor(c.loss_mask, dtype=torch.bool)
    ref = None
    if all(e.ref_logprobs is not None for e in episodes):
        ref, _ = pad_right([e.ref_logprobs for e in episodes], 0.0, dtype=torch.float32)
    return TrainBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        behavior_logprobs=behavior,
        advantages=torch.tensor([e.advantage for e in episodes], dtype=torch.float32),
        truncated=torch.tensor([c.truncated for c in completions], dtype=torch.bool),
        policy_versions=torch.tensor([c.policy_version for c in completions], dtype=torch.long),
        ref_logprobs=ref,
        loss_mask=loss_mask,
    )
