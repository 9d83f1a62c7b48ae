"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, eq. 4–5).

Clip the importance-sampling weight, not the update, so that every token keeps a gradient:

    L = −1/Σ_i|o_i| Σ_i Σ_t sg( clip(r_{i,t}, 1 − ε_low, 1 + ε_high) ) · A_i · log π_θ(o_{i,t})

Its gradient is −ŵ·A·∇log π_θ: REINFORCE re-weighted by a capped ratio. The paper imposes no lower bound
(clip_low = None here) and tunes only ε_high, without publishing the value; 0.28 (our default) follows common
implementations. Clip fractions report where the weight was capped; such tokens still carry a gradient, so
loss/token_frac counts every token with A ≠ 0.

Departures from the paper:
- r uses the generator's behaviour logprobs as π_old, clamped to ±20 in log space (see primitives).
- The paper's general form with a PPO-style token mask M_{i,t} (eq. 6–7) is not implemented.
- Optional β·KL and entropy bonus (0 in the paper); `loss_agg` other than token_mean is allowed.
- The loss *value* is −ŵ·A·log π, not a surrogate of the return; only its gradient is meaningful.
- Optional rollout correction (correction.py). With tis or mis the ratio is taken to the trainer's own logprobs, 1
  at the step, so ŵ = 1 and the correction's weight replaces it.
"""

from __future__ import annotations

import torch
from torch import nn

from forge_exp.rl.losses.correction import RolloutCorrection
from forge_exp.rl.losses.primitives import (
    Clipped,
    clip_ratio,
    finish,
    log_ratio,
    policy_terms,
    prepare_inputs,
)


class CISPOLoss(nn.Module):
    """−sg(clip(r)) · A · log π_θ per token, token-mean over the batch by default."""

    def __init__(
        self,
        clip_low: float | None = None,
        clip_high: float | None = 0.28,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        loss_agg: str = "token_mean",
        horizon: int | None = None,
        rollout_correction: str = "none",
        rollout_cap: float | None = None,
    ) -> None:
        super().__init__()
        self.clip_low, self.clip_high = clip_low, clip_high
        self.correction = RolloutCorrection(rollout_correction, rollout_cap)
        self.regularizers, self.agg, self.required_inputs = policy_terms(
            beta, kl_estimator, entropy_coef, loss_agg, horizon
        )

    def forward(
        self,
        logprobs: torch.Tensor,  # [B, T]
        behavior_logprobs: torch.Tensor,  # [B, T]
        advantages: torch.Tensor,  # [B, 1]
        padding_mask: torch.Tensor,  # [B, T]
        ref_logprobs: torch.Tensor | None = None,  # [B, T]
        entropy: torch.Tensor | None = None,  # [B, T]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.correction(prepare_inputs(logprobs, behavior_logprobs, advantages, padding_mask, ref_logprobs, entropy))
        x = c.x
        ratio = log_ratio(x.logprobs, c.anchor).exp()  # [B, T]
        weight = clip_ratio(ratio, self.clip_low, self.clip_high).detach()  # [B, T], stop-gradient
        per_token = c.weigh(-weight * x.advantages * x.logprobs)  # [B, T]
        none = torch.zeros_like(x.mask)
        capped = Clipped(
            low=none if self.clip_low is None else ratio.detach() < 1.0 - self.clip_low,
            high=none if self.clip_high is None else ratio.detach() > 1.0 + self.clip_high,
            dual=none,
        )
        active = (x.advantages != 0).expand_as(x.mask)
        return finish(self.agg(per_token, x.mask), x, ratio, capped, self.regularizers, self.agg, active=active,
                      extra=c.metrics)
