"""The clipped-surrogate family: GRPO, Dr. GRPO and DAPO are configurations of one loss.

    L = agg_t[ −min(r_t·A, clip(r_t, 1 − ε_low, 1 + ε_high)·A) + β·KL_t − c_H·H_t ]     r_t = π_θ(y_t)/π_b(y_t)

GRPO    Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, eq. 3: ε_low = ε_high = 0.2, β = 0.04 with the k3
        estimator, group-normalised advantages, loss_agg = seq_mean (1/G Σ_i 1/|o_i| Σ_t).
Dr.GRPO Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783: advantages without std
        normalisation (advantage=mean) and loss_agg = fixed_horizon (Σ_t over tokens / a constant max length),
        β = 0.
DAPO    Yu et al. 2025, arXiv 2503.14476, eq. 8: clip-higher (ε_low = 0.2, ε_high = 0.28), loss_agg = token_mean
        (1/Σ|o_i| Σ_i Σ_t), β = 0; dynamic sampling and overlong filtering/shaping live in rl/filters.py.
Dual clip (Ye et al. 2020, arXiv 1912.09729): for A < 0 the objective is also bounded below by c·A (c > 1).

Departures from the papers:
- π_old is the behaviour policy: the generator's own logprobs (`behavior_logprobs`). It anchors the trust region
  and corrects for the generator being up to `max_policy_age` versions stale, in one ratio. The papers
  recompute π_old with the trainer.
- KL uses the clamped estimators of rl/kl.py, and the log-ratio is clamped to ±20 before exp (see primitives).
- A fully masked row is left out of seq_mean's batch mean (it counts in fixed_horizon's B).
- Optional entropy bonus (entropy_coef), not in any of the three papers; 0 by default.
- Optional rollout correction (rollout_correction: none | tis | mis | seq_mask, correction.py); none by default.
"""

from __future__ import annotations

from forge_exp.rl.loss_options import GRPOOptions
from forge_exp.rl.losses.correction import Corrected
from forge_exp.rl.losses.policy import PolicyLoss, Term
from forge_exp.rl.losses.primitives import clipped_surrogate, log_ratio


class GRPOLoss(PolicyLoss):
    """PPO clipped surrogate over group-relative advantages, + β·KL to the reference, + entropy bonus."""

    schema = GRPOOptions

    def term(self, c: Corrected) -> Term:
        o = self.options
        ratio = log_ratio(c.x.logprobs, c.anchor).exp()  # [B, T]
        per_token, clipped = clipped_surrogate(ratio, c.x.advantages, o.clip_low, o.clip_high, o.dual_clip)
        return Term(per_token, ratio, clipped)
