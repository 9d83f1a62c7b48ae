"""The policy losses' knobs, torch-free: each dataclass is its loss family's schema (config/store.py registers it as
`schema/loss/<family>`, the `algorithm.loss` node), with the defaults and range checks stated here once. A loss takes
its node's keys and parses them into its dataclass (`GRPOLoss(beta=0.0)` is `GRPOLoss` over `GRPOOptions(beta=0.0)`:
rl/losses/policy.py), so the constructor has no second list of defaults to drift from.

Defaults are each family's paper's (docs/algorithms.md); conf/algorithm/*.yaml states only what an algorithm
changes (DAPO's clip-higher, Dr. GRPO's fixed horizon, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from forge_exp.checks import FieldError, at_least, finite, positive, within
from forge_exp.choices import KLEstimator, LossAgg, RolloutCorrection


@dataclass
class PolicyOptions:
    """What every policy-gradient loss takes (rl/losses/primitives.py: policy_terms; correction.py)."""

    _target_: str = "forge_exp.rl.losses.GRPOLoss"
    beta: float = 0.0  # KL(π_θ ‖ π_ref) coefficient; 0 = no reference model at all
    kl_estimator: KLEstimator = KLEstimator.k3  # k1 | k2 | k3 (Schulman 2020)
    entropy_coef: float = 0.0  # entropy bonus; 0 = off
    loss_agg: LossAgg = LossAgg.seq_mean  # token_mean | seq_mean | fixed_horizon (Dr. GRPO)
    # fixed_horizon's constant, the longest response; null: in a run, the response budget (config/algorithm.py)
    horizon: Optional[int] = None
    # the generator/trainer logprob mismatch (rl/losses/correction.py): none | tis (truncated IS) | mis (masked IS)
    # | seq_mask (drop sequences by their geometric-mean ratio), with its cap C > 1
    rollout_correction: RolloutCorrection = RolloutCorrection.none
    rollout_cap: Optional[float] = None  # null = the mode's own C (forge_exp/choices.py: tis, mis 2; seq_mask 1.001)

    def __post_init__(self) -> None:
        at_least("beta", self.beta, 0)
        finite("entropy_coef", self.entropy_coef)
        within("rollout_cap", self.rollout_cap, 1, float("inf"), low_open=True, nullable=True)
        if self.horizon is not None:
            at_least("horizon", self.horizon, 1)
        if self.loss_agg == LossAgg.fixed_horizon and self.horizon is None:
            raise FieldError("horizon", "must be set for loss_agg=fixed_horizon (the max response length)")


@dataclass
class GRPOOptions(PolicyOptions):
    """GRPOLoss: PPO's clipped surrogate (GRPO, Dr. GRPO, DAPO, dual clip). Defaults: GRPO's (DeepSeekMath eq. 3)."""

    beta: float = 0.04  # with the k3 estimator (DeepSeekMath eq. 4)
    clip_low: Optional[float] = 0.2  # ratio ≥ 1 − clip_low; null = no lower clip
    clip_high: Optional[float] = 0.2  # ratio ≤ 1 + clip_high; null = no upper clip
    dual_clip: Optional[float] = None  # c > 1: for A < 0 bound the objective at c·A (Ye et al. 2020)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(self.clip_low, self.clip_high)
        if self.dual_clip is not None:
            within("dual_clip", self.dual_clip, 1, float("inf"), low_open=True)


@dataclass
class GSPOOptions(PolicyOptions):
    _target_: str = "forge_exp.rl.losses.GSPOLoss"
    clip_low: Optional[float] = 3e-4  # sequence-level ratios stay near 1: the paper's range is tiny
    clip_high: Optional[float] = 4e-4
    token_level: bool = False  # GSPO-token (per-token advantages) instead of sequence-level GSPO

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(self.clip_low, self.clip_high)
        if self.rollout_correction in ("tis", "mis"):
            mode = RolloutCorrection(self.rollout_correction).value
            raise FieldError("rollout_correction", f"must be none or seq_mask for GSPO, got {mode}: its ratio is per "
                                                   f"sequence, and tis/mis weight tokens")


@dataclass
class CISPOOptions(PolicyOptions):
    _target_: str = "forge_exp.rl.losses.CISPOLoss"
    loss_agg: LossAgg = LossAgg.token_mean  # 1/Σ|o_i| Σ_i Σ_t (MiniMax-M1 eq. 4)
    clip_low: Optional[float] = None  # the paper imposes no lower bound on the IS weight
    clip_high: Optional[float] = 0.28  # ε_high: tuned in the paper, value not published

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(self.clip_low, self.clip_high)


@dataclass
class SAPOOptions(PolicyOptions):
    _target_: str = "forge_exp.rl.losses.SAPOLoss"
    tau_pos: float = 1.0  # gate temperature for A > 0
    tau_neg: float = 1.05  # gate temperature for A ≤ 0

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("tau_pos", self.tau_pos)
        positive("tau_neg", self.tau_neg)


@dataclass
class ReinforceOptions(PolicyOptions):
    """Its truncated importance weight is rollout_correction=tis (rollout_cap = the truncation)."""

    _target_: str = "forge_exp.rl.losses.ReinforceLoss"
    loss_agg: LossAgg = LossAgg.token_mean


@dataclass
class SFTOptions:
    """SFTLoss has no knobs (rl/losses/sft.py)."""

    _target_: str = "forge_exp.rl.losses.sft.SFTLoss"


def check_clip(clip_low: float | None, clip_high: float | None) -> None:
    within("clip_low", clip_low, 0, 1, high_open=True, nullable=True)
    within("clip_high", clip_high, 0, float("inf"), nullable=True)


LOSS_OPTIONS = {
    "clipped": GRPOOptions, "gspo": GSPOOptions, "cispo": CISPOOptions, "sapo": SAPOOptions,
    "reinforce": ReinforceOptions, "sft": SFTOptions,
}
