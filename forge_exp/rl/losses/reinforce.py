"""REINFORCE with a group baseline (Williams 1992), as RLOO-style LM post-training uses it.

    L = agg_t[ −sg(w_t) · A · log π_θ(y_t) ]       w_t = 1                          (ratio_cap = None, on-policy)
                                                    w_t = min(π_θ/π_b (y_t), c)     (ratio_cap = c: truncated IS)

The truncated importance weight (Espeholt et al. 2018, IMPALA, arXiv 1802.01561 — ρ̄-truncation; also
"truncated IS" for generator/trainer mismatch) corrects for samples from a stale or numerically different
behaviour policy while bounding the variance. The advantage's baseline comes from rl/advantages.py (`loo` is
RLOO, Ahmadian et al. 2024, arXiv 2402.14740).

Departures: the log-ratio is clamped to ±20 before exp; optional β·KL and entropy bonus; the loss *value* is
−w·A·log π (only its gradient is meaningful). With ratio_cap = None the behaviour logprobs still feed the ratio
metrics, but not the loss.
"""

from __future__ import annotations

import torch
from torch import nn

from forge_exp.rl.losses.primitives import Clipped, finish, log_ratio, policy_terms, prepare_inputs


class ReinforceLoss(nn.Module):
    """−sg(w)·A·log π_θ per token, w = 1 or the behaviour ratio truncated at ratio_cap."""

    def __init__(
        self,
        ratio_cap: float | None = None,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        loss_agg: str = "token_mean",
        horizon: int | None = None,
    ) -> None:
        super().__init__()
        self.ratio_cap = ratio_cap
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
        x = prepare_inputs(logprobs, behavior_logprobs, advantages, padding_mask, ref_logprobs, entropy)
        ratio = log_ratio(x.logprobs, x.behavior_logprobs).exp()  # [B, T]
        none = torch.zeros_like(x.mask)
        if self.ratio_cap is None:
            weight, capped = torch.ones_like(ratio), none
        else:
            weight, capped = ratio.detach().clamp(max=self.ratio_cap), ratio.detach() > self.ratio_cap
        per_token = -weight * x.advantages * x.logprobs  # [B, T]
        active = (x.advantages != 0).expand_as(x.mask)
        clipped = Clipped(low=none, high=capped, dual=none)
        return finish(self.agg(per_token, x.mask), x, ratio, clipped, self.regularizers, self.agg, active=active)
