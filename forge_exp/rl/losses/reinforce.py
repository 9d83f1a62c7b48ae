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

from forge_exp.rl.loss_options import ReinforceOptions
from forge_exp.rl.losses.correction import Corrected
from forge_exp.rl.losses.policy import PolicyLoss, Term
from forge_exp.rl.losses.primitives import log_ratio


class ReinforceLoss(PolicyLoss):
    """−sg(w)·A·log π_θ per token, w = 1 or the rollout correction's weight."""

    schema = ReinforceOptions

    def term(self, c: Corrected) -> Term:
        x = c.x
        ratio = log_ratio(x.logprobs, c.anchor).exp()  # [B, T], for the metrics only
        active = (x.advantages != 0).expand_as(x.mask)
        return Term(-x.advantages * x.logprobs, ratio, None, active)
