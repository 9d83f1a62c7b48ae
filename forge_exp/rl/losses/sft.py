"""Supervised fine-tuning (SFT): the negative log-likelihood of the target tokens, averaged over them.

    L = − Σ_t m_t · log π_θ(y_t | y_<t) / Σ_t m_t          m_t = 1 on target (assistant) tokens, else 0

The maximum-likelihood objective of instruction tuning (Ouyang et al. 2022, arXiv 2203.02155, §3.5), with the
loss on the assistant's tokens only (TRL's `assistant_only_loss` / `completion_only_loss`).
Departures: none. It is a token mean over the tokens it is given; the SFT step (actors/sft.py) weights
micro-batches by their share of the step's target tokens, so with grad_accum > 1 the step still minimises the
token mean over the whole batch.

It takes the loss contract's `logprobs` and `padding_mask` (rl/losses/__init__.py), so `algorithm.loss._target_`
swaps it like any other loss (e.g. for a per-token weighting).
"""

from __future__ import annotations

import torch
from torch import nn


class SFTLoss(nn.Module):
    """Token-mean negative log-likelihood of the tokens where padding_mask is True."""

    def forward(
        self,
        logprobs: torch.Tensor,  # [B, T] log π_θ of each token given those before it (requires grad)
        padding_mask: torch.Tensor,  # [B, T] bool / 0-1 float, True on target tokens
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if logprobs.shape != padding_mask.shape:
            raise ValueError(f"padding_mask has shape {list(padding_mask.shape)} but logprobs has "
                             f"{list(logprobs.shape)}; both are [B, T]")
        mask = padding_mask.bool()
        count = mask.sum()
        nll = -logprobs.masked_fill(~mask, 0.0).sum() / count.clamp(min=1)
        return nll, {"loss/nll": nll.detach(), "loss/target_tokens": count.detach().float()}
