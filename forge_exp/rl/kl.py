"""Per-token estimators of KL(π_θ ‖ π_ref) from samples of π_θ.

Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html). With the log-ratio
    log r = log π_ref(y_t) − log π_θ(y_t)           (tokens y_t sampled from π_θ)
the three estimators are
    k1 = −log r                   unbiased, high variance, can be negative
    k2 = ½ (log r)²               biased, low variance, ≥ 0
    k3 = (r − 1) − log r          unbiased, low variance, ≥ 0   (GRPO, DeepSeekMath eq. 4)

Departures: log r is clamped to ±LOG_RATIO_LIMIT before exponentiation (k3), so that one wildly improbable
token overflows neither float32 nor the update; the bound (e^20 ≈ 5e8) is never reached by a sane batch.
The tokens are sampled by the behaviour policy rather than π_θ itself; the loss families treat that
difference with their importance ratio, not here.
"""

from __future__ import annotations

import torch

LOG_RATIO_LIMIT = 20.0


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log π_θ − log π_ref, per token."""
    # logprobs, ref_logprobs: [B, T]
    return logprobs - ref_logprobs  # [B, T]


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π_ref − log π_θ)², per token."""
    # logprobs, ref_logprobs: [B, T]
    return 0.5 * (ref_logprobs - logprobs) ** 2  # [B, T]


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = π_ref/π_θ − log(π_ref/π_θ) − 1, per token (the GRPO estimator)."""
    # logprobs, ref_logprobs: [B, T]
    log_r = (ref_logprobs - logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # [B, T]
    return torch.exp(log_r) - log_r - 1.0  # [B, T]


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}  # keyed by forge_exp.choices.KL_ESTIMATORS


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate [B, T] with the named estimator (k1 | k2 | k3)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}, got {estimator!r}")
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)
