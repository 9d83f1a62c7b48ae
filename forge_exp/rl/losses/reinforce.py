"""REINFORCE with a group baseline (Williams 1992), as RLOO-style LM post-training uses it.

    L = agg_t[ −sg(w_t) · A · log π_θ(y_t) ]       w_t = 1                          (rollout_correction: none)
                                                    w_t = min(π_train/π_gen, C)     (tis: truncated IS)

The truncated importance weight (Espeholt et al. 2018, IMPALA, arXiv 1802.01561 — ρ̄-truncation; Yao et al. 2025
for generator/trainer mismatch) corrects for samples from a stale or numerically different behaviour policy while
bounding the variance; it is the shared rollout correction (correction.py: tis, and also mis, seq_mask). The
advantage's baseline comes from rl/advantages.py (`loo` is RLOO, Ahmadian et al. 2024, arXiv 2402.14740).

Departures: the log-ratio is clamped to ±20 before exp; optional β·KL and entropy bonus; the loss *value* is
−w·A·log π (only its gradient is meaningful). With none the behaviour logprobs still feed the ratio metrics, but
not the loss.
"""

from __future__ import annotations

import torch
from torch import nn

from forge_exp.rl.losses.correction import RolloutCorrection
from forge_exp.rl.losses.primitives import finish, log_ratio, policy_terms, prepare_inputs


class ReinforceLoss(nn.Module):
    """−sg(w)·A·log π_θ per token, w = 1 or the rollout correction's weight."""

    def __init__(
        self,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        loss_agg: str = "token_mean",
        horizon: int | None = None,
        rollout_correction: str = "none",
        rollout_cap: float | None = None,
    ) -> None:
        super().__init__()
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
        ratio = log_ratio(x.logprobs, c.anchor).exp()  # [B, T], for the metrics only
        per_token = c.weigh(-x.advantages * x.logprobs)  # [B, T]
        active = (x.advantages != 0).expand_as(x.mask)
        return finish(self.agg(per_token, x.mask), x, ratio, None, self.regularizers, self.agg, active=active,
                      extra=c.metrics)
