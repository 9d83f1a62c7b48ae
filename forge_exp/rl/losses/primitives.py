"""Shared pieces every loss family is built from: input checks, importance ratios, the clipped surrogate,
masked aggregations, the KL / entropy terms and the standard metrics.

Shapes: B sequences, T response positions (right-padded); `mask` is True on real response tokens.
Every function here is pure and differentiable where it should be; metrics are detached 0-dim tensors
(no host sync), except `prepare_inputs`, which syncs once to reject NaN/inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge_exp.choices import LOSS_AGGREGATIONS
from forge_exp.rl.kl import LOG_RATIO_LIMIT, kl_estimate


# ---------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class LossInputs:
    """The loss inputs, checked and with padding positions zeroed (so garbage there cannot leak NaN)."""

    logprobs: torch.Tensor  # [B, T] policy logprobs, requires grad
    behavior_logprobs: torch.Tensor  # [B, T] detached
    advantages: torch.Tensor  # [B, 1] or [B, T] detached
    mask: torch.Tensor  # [B, T] bool
    ref_logprobs: torch.Tensor | None = None  # [B, T] detached
    entropy: torch.Tensor | None = None  # [B, T] requires grad


def prepare_inputs(
    logprobs: torch.Tensor,  # [B, T]
    behavior_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B], [B, 1] or [B, T]
    padding_mask: torch.Tensor,  # [B, T] bool or 0/1 float
    ref_logprobs: torch.Tensor | None = None,  # [B, T]
    entropy: torch.Tensor | None = None,  # [B, T]
) -> LossInputs:
    """Check shapes and finiteness (on real tokens only) and zero the padding positions.

    Raises ValueError naming the offending input: a NaN/inf that reached the loss would otherwise become a
    silent NaN update of every weight.
    """
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {list(logprobs.shape)}")
    shape = logprobs.shape
    per_token = {"behavior_logprobs": behavior_logprobs, "padding_mask": padding_mask}
    per_token.update({k: v for k, v in (("ref_logprobs", ref_logprobs), ("entropy", entropy)) if v is not None})
    for name, t in per_token.items():
        if t.shape != shape:
            raise ValueError(
                f"{name} has shape {list(t.shape)} but logprobs has {list(shape)}; every per-token input is [B, T]"
            )
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    if advantages.dim() != 2 or advantages.shape[0] != shape[0] or advantages.shape[1] not in (1, shape[1]):
        raise ValueError(
            f"advantages must be [B], [B, 1] or [B, T] with B, T = {list(shape)}, got {list(advantages.shape)}"
        )

    mask = padding_mask.bool()
    adv_mask = mask.any(-1, keepdim=True) if advantages.shape[1] == 1 else mask  # rows / tokens that count
    checks = {
        "logprobs": ~torch.isfinite(logprobs) & mask,
        "behavior_logprobs": ~torch.isfinite(behavior_logprobs) & mask,
        "advantages": ~torch.isfinite(advantages) & adv_mask,
    }
    if ref_logprobs is not None:
        checks["ref_logprobs"] = ~torch.isfinite(ref_logprobs) & mask
    if entropy is not None:
        checks["entropy"] = ~torch.isfinite(entropy) & mask
    bad = torch.stack([c.any() for c in checks.values()]).tolist()  # one host sync for all checks
    for name, is_bad in zip(checks, bad):
        if is_bad:
            n = int(checks[name].sum())
            raise ValueError(
                f"{name} has {n} NaN/inf value(s) on response tokens; refusing to compute a loss "
                "(it would be a NaN update). Check the model / generator / reward that produced it."
            )

    def clean(t: torch.Tensor | None, detach: bool) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.detach() if detach else t
        return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))

    return LossInputs(
        logprobs=clean(logprobs, detach=False),
        behavior_logprobs=clean(behavior_logprobs, detach=True),  # the behaviour policy is a constant
        advantages=torch.where(adv_mask, advantages.detach(), 0.0).to(logprobs.dtype),
        mask=mask,
        ref_logprobs=clean(ref_logprobs, detach=True),
        entropy=clean(entropy, detach=False),
    )


# ---------------------------------------------------------------------------------------------- ratios
def log_ratio(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor) -> torch.Tensor:
    """log π_θ/π_behaviour per token, clamped to ±LOG_RATIO_LIMIT (no overflow in exp)."""
    # logprobs, behavior_logprobs: [B, T]
    return (logprobs - behavior_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # [B, T]


def sequence_log_ratio(token_log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1/|y_i| Σ_t log r_{i,t} per row ([B, 1]): the log of the geometric-mean ratio; 0 for a fully masked row."""
    # token_log_ratio: [B, T], mask: [B, T] bool
    m = mask.to(token_log_ratio.dtype)
    return ((token_log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [B, 1]


def clip_ratio(ratio: torch.Tensor, clip_low: float | None, clip_high: float | None) -> torch.Tensor:
    """clip(r, 1 − ε_low, 1 + ε_high); a None bound is no bound."""
    lo = None if clip_low is None else 1.0 - clip_low
    hi = None if clip_high is None else 1.0 + clip_high
    return ratio if lo is None and hi is None else ratio.clamp(min=lo, max=hi)  # [B, T]


@dataclass(frozen=True)
class Clipped:
    """Where clipping cut the gradient off, per token (True = no policy gradient from that token)."""

    low: torch.Tensor  # [B, T] bool: A < 0 and r < 1 − ε_low
    high: torch.Tensor  # [B, T] bool: A > 0 and r > 1 + ε_high
    dual: torch.Tensor  # [B, T] bool: A < 0 and r > c (dual clip)


def clipped_surrogate(
    ratio: torch.Tensor,  # [B, T] (or [B, 1] at sequence level)
    advantages: torch.Tensor,  # broadcastable to ratio
    clip_low: float | None,
    clip_high: float | None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, Clipped]:
    """Per-token PPO loss −min(r·A, clip(r)·A) (Schulman et al. 2017, arXiv 1707.06347, eq. 7), with the
    dual clip of Ye et al. 2020 (arXiv 1912.09729, eq. 5): for A < 0 the objective is bounded below by c·A."""
    adv = advantages.expand_as(ratio)
    objective = torch.minimum(ratio * adv, clip_ratio(ratio, clip_low, clip_high) * adv)  # [B, T]
    none = torch.zeros_like(ratio, dtype=torch.bool)
    dual = none
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, dual_clip * adv), objective)
        dual = (adv < 0) & (ratio > dual_clip)
    low = none if clip_low is None else (adv < 0) & (ratio < 1.0 - clip_low)
    high = none if clip_high is None else (adv > 0) & (ratio > 1.0 + clip_high)
    return -objective, Clipped(low=low, high=high, dual=dual)


# ---------------------------------------------------------------------------------------------- aggregation
def token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over all real tokens of the batch / their number (DAPO's token-level loss)."""
    # x: [B, T], mask: [B, T] bool
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of (mean over that sequence's tokens) (GRPO, DeepSeekMath eq. 3).
    A fully masked row is a removed row: it is left out of both sums."""
    # x: [B, T], mask: [B, T] bool
    m = mask.to(x.dtype)
    lengths = m.sum(-1)  # [B]
    per_seq = (x * m).sum(-1) / lengths.clamp(min=1.0)  # [B]
    return per_seq.sum() / (lengths > 0).to(x.dtype).sum().clamp(min=1.0)


def fixed_horizon_mean(x: torch.Tensor, mask: torch.Tensor, horizon: int) -> torch.Tensor:
    """Σ over all real tokens / (B · horizon): Dr. GRPO's constant normaliser (arXiv 2503.20783, §3.1).
    Every row counts in B, masked or not, so the denominator never depends on the data."""
    # x: [B, T], mask: [B, T] bool
    if x.shape[-1] > horizon:
        raise ValueError(
            f"fixed_horizon aggregation: responses are {x.shape[-1]} tokens wide but the horizon is {horizon}; "
            "algorithm.loss.horizon must be at least dataset.max_new_tokens"
        )
    m = mask.to(x.dtype)
    return (x * m).sum() / (x.shape[0] * horizon)


@dataclass(frozen=True)
class Aggregation:
    """How per-token values become one scalar: token_mean | seq_mean | fixed_horizon (needs horizon)."""

    mode: str = "token_mean"
    horizon: int | None = None

    def __post_init__(self) -> None:  # (ranges are the schema's: rl/loss_options.py; this is the dispatch)
        if self.mode not in LOSS_AGGREGATIONS:
            raise ValueError(f"loss_agg must be one of {list(LOSS_AGGREGATIONS)}, got {self.mode!r}")
        if self.mode == "fixed_horizon" and self.horizon is None:
            raise ValueError("loss_agg=fixed_horizon needs a horizon (the max response length)")

    def __call__(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: [B, T], mask: [B, T] bool
        if self.mode == "token_mean":
            return token_mean(x, mask)
        if self.mode == "seq_mean":
            return seq_mean(x, mask)
        return fixed_horizon_mean(x, mask, self.horizon)


# ---------------------------------------------------------------------------------------------- KL, entropy
@dataclass(frozen=True)
class Regularizers:
    """β·KL(π_θ ‖ π_ref) added per token and −entropy_coef·H subtracted per token, aggregated like the
    policy term. Which inputs they need depends on the coefficients."""

    beta: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0

    @property
    def inputs(self) -> frozenset[str]:
        return frozenset({"ref_logprobs"} if self.beta > 0 else ()) | frozenset(
            {"entropy"} if self.entropy_coef != 0 else ()
        )

    def __call__(self, x: LossInputs, agg: Aggregation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """→ (scalar term to add to the loss, mean KL, mean entropy); the last two are detached metrics."""
        zero = torch.zeros((), dtype=x.logprobs.dtype, device=x.logprobs.device)
        term, kl_metric, ent_metric = zero, zero, zero
        if x.ref_logprobs is not None:
            with torch.set_grad_enabled(self.beta > 0 and torch.is_grad_enabled()):  # measured only: no graph
                kl = agg(kl_estimate(x.logprobs, x.ref_logprobs, self.kl_estimator), x.mask)
            kl_metric = kl.detach()
            if self.beta > 0:
                term = term + self.beta * kl
        elif self.beta > 0:
            raise ValueError("algorithm.beta > 0 but ref_logprobs were not passed to the loss")
        if x.entropy is not None:
            with torch.set_grad_enabled(self.entropy_coef != 0 and torch.is_grad_enabled()):
                ent = agg(x.entropy, x.mask)
            ent_metric = ent.detach()
            if self.entropy_coef != 0:
                term = term - self.entropy_coef * ent
        elif self.entropy_coef != 0:
            raise ValueError("algorithm.entropy_coef != 0 but entropy was not passed to the loss")
        return term, kl_metric, ent_metric


# ---------------------------------------------------------------------------------------------- metrics
POLICY_INPUTS = frozenset({"logprobs", "behavior_logprobs", "advantages", "padding_mask"})


def policy_terms(
    beta: float, kl_estimator: str, entropy_coef: float, loss_agg: str, horizon: int | None
) -> tuple["Regularizers", "Aggregation", frozenset[str]]:
    """What every policy-gradient loss builds alike: its KL/entropy terms, its aggregation, and the inputs it asks
    the trainer for (rl.losses.loss_inputs reads `required_inputs`)."""
    regularizers = Regularizers(beta=beta, kl_estimator=kl_estimator, entropy_coef=entropy_coef)
    return regularizers, Aggregation(loss_agg, horizon), POLICY_INPUTS | regularizers.inputs


def frac(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of real tokens where flags is True (0 when there are none)."""
    # flags, mask: [B, T] bool
    m = mask.to(torch.float32)
    return ((flags & mask).to(torch.float32).sum() / m.sum().clamp(min=1.0)).detach()


def finish(
    policy_loss: torch.Tensor,  # scalar, aggregated policy term
    x: LossInputs,
    ratio: torch.Tensor,  # [B, T] token importance ratio π_θ/π_behaviour
    clipped: Clipped | None,
    regularizers: Regularizers,
    agg: Aggregation,
    active: torch.Tensor | None = None,  # [B, T] bool, tokens with a policy gradient; default: A ≠ 0 and not clipped
    extra: dict[str, torch.Tensor] | None = None,  # the family's own metrics (a rollout correction's)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Add KL and entropy terms to the policy term and build the standard metrics (and `extra`).

    loss/kl and loss/entropy are the aggregated raw values (before β / entropy_coef). loss/token_frac is the
    fraction of real tokens that carry a policy gradient: advantage ≠ 0 and not cut off by a clip.
    """
    term, kl_metric, ent_metric = regularizers(x, agg)
    mask = x.mask
    adv = x.advantages.expand_as(x.logprobs)
    r = ratio.detach()
    none = torch.zeros_like(mask)
    c = clipped or Clipped(low=none, high=none, dual=none)
    if active is None:
        active = (adv != 0) & ~(c.low | c.high | c.dual)
    metrics = {
        "loss/policy": policy_loss.detach(),
        "loss/kl": kl_metric,
        "loss/entropy": ent_metric,
        "loss/clip_frac_low": frac(c.low, mask),
        "loss/clip_frac_high": frac(c.high, mask),
        "loss/clip_frac_dual": frac(c.dual, mask),
        "loss/ratio_mean": token_mean(r, mask),
        "loss/ratio_max": torch.where(mask, r, torch.zeros((), dtype=r.dtype, device=r.device)).max(),
        "loss/token_frac": frac(active, mask),
        **(extra or {}),
    }
    return policy_loss + term, metrics
