"""How far apart the generator's and the trainer's logprobs of the same tokens are: the mismatch/ metrics the trainer
returns with every step (trainers/update.py), whatever the generator and the loss.

    Δ_t = log π_train(y_t) − log π_gen(y_t)        ρ_t = exp(Δ_t) = π_train/π_gen       (rl/losses/correction.py)

π_gen is what the generator returned with the token; π_train the trainer's logprob of it under the weights the step
trains, in the trainer's numerics (detached). Over the model's own response tokens of the batch:

    mismatch/logp_diff_abs_mean     mean |Δ_t|
    mismatch/logp_diff_mean         mean Δ_t (> 0: the trainer finds the sampled tokens likelier than the generator did)
    mismatch/kl_k3                  KL(π_gen ‖ π_train) from the sampled tokens, k3 = (ρ − 1) − log ρ per token
                                    (Schulman 2020, rl/kl.py; the samples are the generator's, so this direction)
    mismatch/ratio_min, ratio_p01, ratio_p50, ratio_p99, ratio_max     of ρ_t (quantiles interpolated linearly)
    mismatch/tokens                 how many tokens were measured

and the same under mismatch/current/ for the episodes sampled at the trainer's current weight version, where Δ is the
two engines' numerics alone; over all tokens it adds how far the policy moved since a stale episode was sampled. A
step without such an episode has no mismatch/current/ keys.
"""

from __future__ import annotations

import torch

from forge_exp.rl.kl import LOG_RATIO_LIMIT, kl_k3

QUANTILES = {"p01": 0.01, "p50": 0.5, "p99": 0.99}


def quantiles(values: torch.Tensor, qs: list[float]) -> torch.Tensor:
    """Linearly interpolated quantiles of a 1-D tensor (numpy's default), by one sort: no size limit."""
    s = values.sort().values  # [n]
    pos = torch.tensor(qs, dtype=s.dtype, device=s.device) * (s.numel() - 1)  # [q]
    lo = pos.floor().long()
    hi = pos.ceil().long()
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)  # [q]


def _stats(delta: torch.Tensor) -> torch.Tensor:
    """[mean |Δ|, mean Δ, mean k3, min ρ, quantiles of ρ..., max ρ, n] of the measured tokens' Δ ([n], n > 0)."""
    rho = delta.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()  # [n]
    k3 = kl_k3(torch.zeros_like(delta), delta)  # log r = Δ: (ρ − 1) − Δ
    q = quantiles(rho, [0.0, *QUANTILES.values(), 1.0])  # min, p01, p50, p99, max
    n = torch.tensor([delta.numel()], dtype=delta.dtype, device=delta.device)
    return torch.cat([delta.abs().mean()[None], delta.mean()[None], k3.mean()[None], q, n])


KEYS = ["logp_diff_abs_mean", "logp_diff_mean", "kl_k3", "ratio_min", *(f"ratio_{k}" for k in QUANTILES),
        "ratio_max", "tokens"]


def mismatch_metrics(
    train_logprobs: torch.Tensor,  # [B, T] π_train, detached
    behavior_logprobs: torch.Tensor,  # [B, T] π_gen
    mask: torch.Tensor,  # [B, T] bool, the tokens to measure (the model's own)
    current: torch.Tensor | None = None,  # [B] bool, episodes sampled at the trainer's current version
) -> dict[str, float]:
    """The mismatch/ metrics of the module docstring (floats: one host sync)."""
    delta = (train_logprobs.detach().double() - behavior_logprobs.double())  # [B, T]
    groups = {"mismatch/": mask.bool()}
    if current is not None:
        groups["mismatch/current/"] = mask.bool() & current.bool()[:, None]
    parts = {prefix: _stats(delta[m]) for prefix, m in groups.items() if bool(m.any())}
    if not parts:
        return {}
    values = torch.cat(list(parts.values())).tolist()
    names = [prefix + k for prefix in parts for k in KEYS]
    return dict(zip(names, values))
