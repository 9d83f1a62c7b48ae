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

from forge_exp.rl.loss_options import CISPOOptions
from forge_exp.rl.losses.correction import Corrected
from forge_exp.rl.losses.policy import PolicyLoss, Term
from forge_exp.rl.losses.primitives import Clipped, clip_ratio, log_ratio


class CISPOLoss(PolicyLoss):
    """−sg(clip(r)) · A · log π_θ per token, token-mean over the batch by default."""

    schema = CISPOOptions

    def term(self, c: Corrected) -> Term:
        x, o = c.x, self.options
        ratio = log_ratio(x.logprobs, c.anchor).exp()  # [B, T]
        weight = clip_ratio(ratio, o.clip_low, o.clip_high).detach()  # [B, T], stop-gradient
        none = torch.zeros_like(x.mask)
        capped = Clipped(
            low=none if o.clip_low is None else ratio.detach() < 1.0 - o.clip_low,
            high=none if o.clip_high is None else ratio.detach() > 1.0 + o.clip_high,
            dual=none,
        )
        active = (x.advantages != 0).expand_as(x.mask)
        return Term(-weight * x.advantages * x.logprobs, ratio, capped, active)
