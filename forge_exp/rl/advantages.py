"""Group-relative advantages: one scalar per completion from the rewards of its group.

Pure functions of a rewards tensor [..., G] (or a list of G floats); they act along the last dimension, so
[N, G] computes N groups at once. A group of one has no baseline: its advantage is 0.

    group_norm  (r − mean) / (std + eps)       GRPO, DeepSeekMath arXiv 2402.03300 §4.1.2 (outcome supervision)
    mean        r − mean                        Dr. GRPO arXiv 2503.20783 (std normalisation removed: it biases
                                                towards too-easy and too-hard questions)
    loo         r_i − mean_{j≠i} r_j            RLOO, Kool et al. 2019 / Ahmadian et al. 2024 (arXiv 2402.14740)
                = G/(G−1) · (r_i − mean)

Departures: std is the unbiased (Bessel-corrected) sample std, as TRL / torchforge use; the paper does not say.
A zero-variance group gives advantages exactly 0 (never NaN, never a rounding error blown up by a tiny std)
under every method; the arithmetic is float64 and the result has the rewards' dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _as_tensor(rewards: torch.Tensor | Sequence[float]) -> torch.Tensor:
    r = rewards if isinstance(rewards, torch.Tensor) else torch.tensor(list(rewards), dtype=torch.float32)
    if not r.is_floating_point():
        r = r.float()
    if r.dim() == 0 or r.shape[-1] == 0:
        raise ValueError(f"rewards must be [..., G] with G >= 1, got shape {list(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN/inf; a reward function failed silently (count it as a reward failure)")
    return r


def _centered(r: torch.Tensor) -> torch.Tensor:
    """r − mean in float64, exactly 0 in groups whose rewards are all equal: in float32, mean([0.7] * 8) is not
    0.7, and group_norm would divide that rounding error by a rounding-error std (advantages of ~0.06)."""
    r64 = r.double()  # [..., G]
    constant = (r == r.amax(-1, keepdim=True)).all(-1, keepdim=True)  # [..., 1]
    return torch.where(constant, torch.zeros((), dtype=torch.float64), r64 - r64.mean(-1, keepdim=True))


def group_norm(rewards: torch.Tensor | Sequence[float], eps: float = 1e-6) -> torch.Tensor:
    """(r − mean) / (std + eps) within each group."""
    r = _as_tensor(rewards)  # [..., G]
    if r.shape[-1] == 1:
        return torch.zeros_like(r)
    return (_centered(r) / (r.double().std(-1, keepdim=True) + eps)).to(r.dtype)


def mean_baseline(rewards: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """r − mean within each group."""
    r = _as_tensor(rewards)  # [..., G]
    return _centered(r).to(r.dtype)


def leave_one_out(rewards: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """r_i − mean of the other G − 1 rewards."""
    r = _as_tensor(rewards)  # [..., G]
    g = r.shape[-1]
    if g == 1:
        return torch.zeros_like(r)
    return (_centered(r) * (g / (g - 1))).to(r.dtype)


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "group_norm": group_norm,
    "mean": mean_baseline,
    "loo": leave_one_out,
}


def compute_advantages(
    rewards: torch.Tensor | Sequence[float], method: str = "group_norm", eps: float = 1e-6
) -> torch.Tensor:
    """Advantages [..., G] with the named method (group_norm | mean | loo); `eps` is used by group_norm only."""
    if method not in ADVANTAGES:
        raise ValueError(f"algorithm.advantage must be one of {sorted(ADVANTAGES)}, got {method!r}")
    if method == "group_norm":
        return group_norm(rewards, eps=eps)
    return ADVANTAGES[method](rewards)
