"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, Qwen, arXiv 2507.18071).

The importance ratio and its clip move from tokens to whole sequences (eq. 5–7):

    s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|) = exp( 1/|y_i| Σ_t log r_{i,t} )
    J   = 1/G Σ_i min( s_i·A_i, clip(s_i, 1 − ε_low, 1 + ε_high)·A_i )      (paper: ε_low 3e-4, ε_high 4e-4)

GSPO-token (eq. 13–14) allows per-token advantages A_{i,t}:

    s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]
    J       = 1/G Σ_i 1/|y_i| Σ_t min( s_{i,t}·A_{i,t}, clip(s_{i,t})·A_{i,t} )

With one advantage per sequence both give the same value and gradient (tested).

Departures from the paper:
- π_old is the generator's behaviour logprobs (see grpo.py); the token log-ratios are clamped to ±20.
- The per-sequence term is spread over the sequence's tokens and aggregated with `loss_agg`; the paper's
  objective is loss_agg = seq_mean (the default). token_mean weights sequences by length.
- Optional β·KL and entropy bonus (both 0 in the paper), aggregated like the policy term.
- Clip fractions count tokens (all tokens of a clipped sequence), as the paper's Figure 2 does.
- Optional rollout correction: none or seq_mask (correction.py). s_i at the step is the geometric-mean ratio that
  seq_mask bounds; tis and mis weight tokens, which a per-sequence ratio has no place for: refused.
"""

from __future__ import annotations

import torch
from torch import nn

from forge_exp.rl.losses.correction import RolloutCorrection
from forge_exp.rl.losses.primitives import (
    Clipped,
    clipped_surrogate,
    finish,
    log_ratio,
    policy_terms,
    prepare_inputs,
    seq_mean,
    sequence_log_ratio,
)


class GSPOLoss(nn.Module):
    """Sequence-level clipped surrogate (GSPO), or GSPO-token with token_level=True."""

    def __init__(
        self,
        clip_low: float | None = 3e-4,
        clip_high: float | None = 4e-4,
        token_level: bool = False,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        loss_agg: str = "seq_mean",
        horizon: int | None = None,
        rollout_correction: str = "none",
        rollout_cap: float | None = None,
    ) -> None:
        super().__init__()
        self.clip_low, self.clip_high, self.token_level = clip_low, clip_high, token_level
        self.correction = RolloutCorrection(rollout_correction, rollout_cap, per_sequence=True)
        self.regularizers, self.agg, self.required_inputs = policy_terms(
            beta, kl_estimator, entropy_coef, loss_agg, horizon
        )

    def forward(
        self,
        logprobs: torch.Tensor,  # [B, T]
        behavior_logprobs: torch.Tensor,  # [B, T]
        advantages: torch.Tensor,  # [B, 1] ([B, T] allowed with token_level)
        padding_mask: torch.Tensor,  # [B, T]
        ref_logprobs: torch.Tensor | None = None,  # [B, T]
        entropy: torch.Tensor | None = None,  # [B, T]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.correction(prepare_inputs(logprobs, behavior_logprobs, advantages, padding_mask, ref_logprobs, entropy))
        x = c.x  # (anchor: the behaviour logprobs, as none and seq_mask keep it)
        token_lr = log_ratio(x.logprobs, c.anchor)  # [B, T]
        seq_lr = sequence_log_ratio(token_lr, x.mask)  # [B, 1]
        if self.token_level:
            # value s_i on every token, gradient s_i · ∇log π_θ(y_t)
            s = torch.exp(seq_lr.detach() + x.logprobs - x.logprobs.detach())  # [B, T]
        else:
            if x.advantages.shape[-1] != 1:
                raise ValueError(
                    "GSPO (sequence level) takes one advantage per sequence, got [B, T] advantages; "
                    "set algorithm.gspo_token=true for per-token advantages"
                )
            s = torch.exp(seq_lr)  # [B, 1]
        per_seq, clipped = clipped_surrogate(s, x.advantages, self.clip_low, self.clip_high)  # [B, 1] or [B, T]
        per_token = per_seq.expand_as(x.logprobs)  # [B, T]
        clipped = Clipped(*(c.expand_as(x.mask) for c in (clipped.low, clipped.high, clipped.dual)))
        loss, metrics = finish(self.agg(per_token, x.mask), x, token_lr.exp(), clipped, self.regularizers, self.agg,
                               extra=c.metrics)
        seq_rows = torch.exp(seq_lr.detach()).expand_as(x.logprobs)  # [B, T]
        metrics["loss/seq_ratio_mean"] = seq_mean(seq_rows, x.mask)
        return loss, metrics
