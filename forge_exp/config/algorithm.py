"""Schemas of the `algorithm` group (conf/algorithm/*.yaml): the GRPO family (RLAlgorithm) and SFT, and of their
`loss` node, one schema per loss family.

Each knob has one home: a loss's knobs live in `algorithm.loss` (swept as `algorithm.loss.clip_high=...`, or with
the short alias `algorithm.clip_high=...` that the CLI expands to the same key: config/aliases.py); batch,
optimizer, sampling and filters live in `algorithm` itself. Ranges are checked here and only here.
docs/algorithms.md describes every algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from forge_exp.checks import FieldError, at_least, finite, positive, within
from forge_exp.choices import Advantage, KLEstimator, LossAgg, RolloutCorrection


# ---------------------------------------------------------------------------------------------- losses
@dataclass
class PolicyLoss:
    """What every policy-gradient loss takes (rl/losses/primitives.py: policy_terms)."""

    _target_: str = "forge_exp.rl.losses.GRPOLoss"
    beta: float = 0.0  # KL(π_θ ‖ π_ref) coefficient; 0 = no reference model at all
    kl_estimator: KLEstimator = KLEstimator.k3  # k1 | k2 | k3 (Schulman 2020)
    entropy_coef: float = 0.0  # entropy bonus; 0 = off
    loss_agg: LossAgg = LossAgg.seq_mean  # token_mean | seq_mean | fixed_horizon (Dr. GRPO)
    # fixed_horizon's constant: the longest response (a string default is an interpolation OmegaConf resolves)
    horizon: Optional[int] = "${dataset.max_new_tokens}"  # type: ignore[assignment]
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
class ClippedLoss(PolicyLoss):
    """GRPOLoss: PPO's clipped surrogate (GRPO, Dr. GRPO, DAPO, dual clip)."""

    clip_low: Optional[float] = 0.2  # ratio ≥ 1 − clip_low; null = no lower clip
    clip_high: Optional[float] = 0.2  # ratio ≤ 1 + clip_high; null = no upper clip
    dual_clip: Optional[float] = None  # c > 1: for A < 0 bound the objective at c·A (Ye et al. 2020)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(self.clip_low, self.clip_high)
        if self.dual_clip is not None:
            within("dual_clip", self.dual_clip, 1, float("inf"), low_open=True)


@dataclass
class GSPOLossConfig(PolicyLoss):
    _target_: str = "forge_exp.rl.losses.GSPOLoss"
    clip_low: Optional[float] = 3e-4
    clip_high: Optional[float] = 4e-4
    token_level: bool = False  # GSPO-token (per-token advantages) instead of sequence-level GSPO

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(self.clip_low, self.clip_high)
        if self.rollout_correction in (RolloutCorrection.tis, RolloutCorrection.mis):
            raise FieldError("rollout_correction", f"must be none or seq_mask for GSPO, got "
                             f"{self.rollout_correction.value}: its ratio is per sequence, and tis/mis weight tokens")


@dataclass
class CISPOLossConfig(PolicyLoss):
    _target_: str = "forge_exp.rl.losses.CISPOLoss"
    clip_low: Optional[float] = None  # the paper imposes no lower bound on the IS weight
    clip_high: Optional[float] = 0.28

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(self.clip_low, self.clip_high)


@dataclass
class SAPOLossConfig(PolicyLoss):
    _target_: str = "forge_exp.rl.losses.SAPOLoss"
    tau_pos: float = 1.0  # gate temperature for A > 0
    tau_neg: float = 1.05  # gate temperature for A ≤ 0

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("tau_pos", self.tau_pos)
        positive("tau_neg", self.tau_neg)


@dataclass
class ReinforceLossConfig(PolicyLoss):
    """Its truncated importance weight is rollout_correction=tis (rollout_cap = the truncation)."""

    _target_: str = "forge_exp.rl.losses.ReinforceLoss"


@dataclass
class SFTLossConfig:
    _target_: str = "forge_exp.rl.losses.sft.SFTLoss"


def check_clip(clip_low: float | None, clip_high: float | None) -> None:
    within("clip_low", clip_low, 0, 1, high_open=True, nullable=True)
    within("clip_high", clip_high, 0, float("inf"), nullable=True)


# ---------------------------------------------------------------------------------------------- algorithms
@dataclass
class AlgorithmBase:
    """What RL and SFT share: the name, AdamW and the step around it, and the loss."""

    name: str = "grpo"
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per step
    loss: Any = None  # typed by the option's defaults: /schema/loss/<family>@loss

    def __post_init__(self) -> None:
        if not self.name:
            raise FieldError("name", "must be a non-empty string")
        positive("lr", self.lr)
        finite("lr", self.lr)
        at_least("weight_decay", self.weight_decay, 0)
        finite("weight_decay", self.weight_decay)
        if self.loss is None:
            raise FieldError("loss", "must be a node with _target_ (the option's default, conf/algorithm/"
                                     f"{self.name}.yaml); leave algorithm.loss out rather than set it to null")
        positive("max_grad_norm", self.max_grad_norm)
        at_least("grad_accum", self.grad_accum, 1)


@dataclass
class RLAlgorithm(AlgorithmBase):
    """The GRPO family (apps/grpo.py). Defaults are GRPO's (DeepSeekMath, arXiv 2402.03300), batch sized for one
    node."""

    # --- batch: prompts_per_step groups of group_size completions per optimizer step
    group_size: int = 8
    prompts_per_step: int = 16
    # --- advantages (rl/advantages.py)
    advantage: Advantage = Advantage.group_norm  # group_norm | mean | loo
    advantage_eps: float = 1e-6  # group_norm: (r − mean) / (std + eps)
    # --- group filters (rl/filters.py, DAPO)
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, refill
    max_sampling_attempts: int = 3  # generation rounds per batch before training on what is there
    overlong_filter: bool = False  # truncated completions get no loss
    overlong_penalty: bool = False  # soft overlong punishment added to the reward (L_max = dataset.max_new_tokens)
    overlong_buffer: Optional[int] = None  # L_cache in tokens; null = dataset.max_new_tokens // 5 (the paper's
    # 4096 of 20480)
    # --- sampling of training rollouts
    temperature: float = 1.0
    top_p: float = 1.0
    max_policy_age: int = 1  # rollouts may be this many weight versions behind the trainer; 0 = on-policy

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("group_size", self.group_size, 2, "advantages are relative within a group")
        at_least("prompts_per_step", self.prompts_per_step, 1)
        at_least("max_sampling_attempts", self.max_sampling_attempts, 1)
        at_least("max_policy_age", self.max_policy_age, 0)
        positive("advantage_eps", self.advantage_eps)
        positive("temperature", self.temperature, "0 is greedy decoding, which gives a group identical completions")
        within("top_p", self.top_p, 0, 1, low_open=True)
        if self.overlong_buffer is not None:
            at_least("overlong_buffer", self.overlong_buffer, 1)

    @property
    def beta(self) -> float:
        """The KL coefficient of the loss (0 for a loss without one): a reference model runs only when > 0."""
        return float(getattr(self.loss, "beta", 0.0) or 0.0)

    def overlong_buffer_len(self, max_len: int) -> int:
        """L_cache of DAPO's soft overlong punishment, in tokens, for responses of at most max_len tokens."""
        return self.overlong_buffer if self.overlong_buffer is not None else max(1, max_len // 5)


@dataclass
class SFTAlgorithm(AlgorithmBase):
    """Supervised fine-tuning (apps/sft.py, data/sft.py)."""

    name: str = "sft"
    lr: float = 1e-5
    batch_size: int = 8  # rows per optimizer step
    max_seq_len: int = 2048  # tokens per row; a longer example is cut to it
    packing: bool = True  # several examples per row, each with its own position ids and attention
    warmup_steps: int = 0  # linear lr warm-up, then cosine decay to 10% of lr at the last step

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("batch_size", self.batch_size, 1)
        at_least("max_seq_len", self.max_seq_len, 2, "a target token needs one token before it")
        at_least("warmup_steps", self.warmup_steps, 0)

    beta = 0.0  # no reference model


LOSS_SCHEMAS = {
    "clipped": ClippedLoss, "gspo": GSPOLossConfig, "cispo": CISPOLossConfig, "sapo": SAPOLossConfig,
    "reinforce": ReinforceLossConfig, "sft": SFTLossConfig,
}
ALGORITHM_SCHEMAS = {"rl": RLAlgorithm, "sft": SFTAlgorithm}
