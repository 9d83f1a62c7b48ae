"""SAPO: Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347).

The hard clip is replaced by a smooth, temperature-controlled gate on the token ratio r = π_θ/π_old:

    f_τ(r) = (4/τ) · σ(τ·(r − 1))         τ = τ_pos if A > 0 else τ_neg     (paper: τ_pos 1.0, τ_neg 1.05)
    J      = 1/G Σ_i 1/|y_i| Σ_t f_τ(r_{i,t}) · A_i

    ∇f_τ(r) = 4·σ(τ(r−1))·(1 − σ(τ(r−1))) · r · ∇log π_θ

The gradient weight 4σ(1−σ) is 1 at r = 1 (on-policy SAPO has the same gradient as GRPO) and decays smoothly
as r leaves 1, faster for larger τ; τ_neg > τ_pos damps negative-advantage updates more, which the paper finds
stabilising. We implement exactly this f_τ; the loss value at r = 1 is −(2/τ)·A, not −A.

Departures from the paper:
- π_old is the generator's behaviour logprobs, log-ratio clamped to ±20 (see primitives).
- `loss_agg` is configurable; seq_mean (the default) is the paper's 1/G Σ_i 1/|y_i| Σ_t.
- Optional β·KL and entropy bonus (not in the paper).
- No hard clip, so loss/clip_frac_* are 0; loss/sapo_gate_mean reports the mean gradient weight 4σ(1−σ).
- Optional rollout correction (correction.py). With tis or mis the ratio is taken to the trainer's own logprobs, 1
  at the step, where the gate's gradient weight is 1: the correction's weight replaces it.
"""

from __future__ import annotations

import torch

from forge_exp.rl.loss_options import SAPOOptions
from forge_exp.rl.losses.correction import Corrected
from forge_exp.rl.losses.policy import PolicyLoss, Term
from forge_exp.rl.losses.primitives import log_ratio, token_mean


def _temperature(advantages: torch.Tensor, tau_pos: float, tau_neg: float, dtype: torch.dtype) -> torch.Tensor:
    """τ_pos where A > 0, τ_neg elsewhere, built in `dtype` (a float32 1.05 would cost float64 precision)."""
    pos = torch.full((), tau_pos, dtype=dtype, device=advantages.device)
    return torch.where(advantages > 0, pos, torch.full((), tau_neg, dtype=dtype, device=advantages.device))


def soft_gate(ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """f_τ(r) = (4/τ)·σ(τ(r − 1)) with τ chosen per token by the sign of A."""
    # ratio: [B, T], advantages: broadcastable to [B, T]
    tau = _temperature(advantages, tau_pos, tau_neg, ratio.dtype).expand_as(ratio)  # [B, T]
    return (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0))  # [B, T]


class SAPOLoss(PolicyLoss):
    """−f_τ(r)·A per token, asymmetric temperatures for positive / negative advantages."""

    schema = SAPOOptions

    def term(self, c: Corrected) -> Term:
        x, o = c.x, self.options
        tau_pos, tau_neg = float(o.tau_pos), float(o.tau_neg)
        ratio = log_ratio(x.logprobs, c.anchor).exp()  # [B, T]
        with torch.no_grad():
            tau = _temperature(x.advantages, tau_pos, tau_neg, ratio.dtype)  # [B, 1] or [B, T]
            sig = torch.sigmoid(tau * (ratio - 1.0))  # [B, T]
            gate = {"loss/sapo_gate_mean": token_mean(4.0 * sig * (1.0 - sig), x.mask)}
        return Term(-soft_gate(ratio, x.advantages, tau_pos, tau_neg) * x.advantages, ratio, metrics=gate)
