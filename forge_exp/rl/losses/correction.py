"""Rollout correction: the generator and the trainer give the same token different logprobs, and a loss can correct
for it. One knob, `algorithm.loss.rollout_correction` = none | tis | mis | seq_mask, with its cap C beside it
(`algorithm.loss.rollout_cap`; null = the mode's own, forge_exp/choices.py: 2 for tis and mis, 1.001 for seq_mask).

What is compared, per token y_t of a completion o_i
    π_gen    the generator's logprob of y_t (`behavior_logprobs`): the weights the episode was sampled with, up to
             `algorithm.max_policy_age` versions older than the trainer's, in the generator's numerics (its kernels,
             bf16, vLLM's sampler)
    π_train  the trainer's logprob of y_t under the weights this step trains, detached: the value of the `logprobs`
             the loss receives. forge-exp takes one optimizer step per batch, so this is the π_old that the papers
             and peers recompute with the trainer before the update, here at no extra forward pass.
    ρ_t = π_train / π_gen              ρ_geo,i = exp(1/|o_i| Σ_t log ρ_t)   (a sequence's geometric-mean ratio)
ρ carries two things at once: how far the policy moved since the episode was sampled (staleness) and how differently
the two engines compute (numerics). For episodes sampled at the trainer's current version it is numerics alone;
the trainer logs both kinds under mismatch/ every step (rl/mismatch.py).

The modes (w_t: a stop-gradient weight on the family's per-token policy term; "dropped": out of the loss)
    none      the family's ratio is r = π_θ/π_gen: one ratio is both the trust-region anchor and the off-policy
              correction (verl's "bypass" mode). Nothing else changes: the default.
    tis       truncated IS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
              Training", fengyao.notion.site/off-policy-rl; IMPALA's ρ̄ truncation, Espeholt et al. 2018, arXiv
              1802.01561): the family's ratio is taken to π_train instead (r = π_θ/sg(π_θ), the decoupled PPO of
              Hilton et al. 2021, arXiv 2110.00641, with π_prox = π_train) and w_t = min(ρ_t, C).
    mis       masked IS (Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
              Training-Inference Mismatch"): as tis, with w_t = ρ_t where 1/C ≤ ρ_t ≤ C; a token outside is dropped.
    seq_mask  geometric sequence masking (the same post's geometric rejection; verl's rollout_rs=geometric): a
              sequence whose ρ_geo,i leaves [1/C, C] is dropped; the others are trained as with none.
The IS modes move the correction out of the family's ratio into w (leaving it in the ratio too would count it
twice); seq_mask only filters which sequences count, so the ratio stays on π_gen.

Departures from the papers and peers
- π_train is the step's own forward (no separate recompute); with one optimizer step per batch it is the same value.
- ρ mixes staleness and numerics (the papers study numerics on on-policy batches); tis and mis bound both.
- With tis/mis the family's ratio is 1 at the step, so its clip or soft gate cannot act within the one step:
  GRPO, CISPO, SAPO and REINFORCE then share the gradient −w_t·A·∇log π_θ (their values and aggregations still
  differ), as they do in TRL with num_iterations=1. GSPO's ratio is per sequence: it takes none or seq_mask only.
- tis truncates from above only (Yao et al., verl); mis and seq_mask keep the two-sided band [1/C, C].
- seq_mask uses the geometric mean, not the product of the token ratios (TRL's sequence modes): the product's
  spread grows with the response length.
- A dropped token leaves every term and the aggregation's counts (verl's and slime's rejection), rather than staying
  in the denominator with weight 0 (TRL's mask modes). The KL and entropy terms are not weighted by w.
- log ρ is clamped to ±20 before exp, as every log-ratio here (primitives.log_ratio).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from forge_exp.choices import DEFAULT_ROLLOUT_CAP, ROLLOUT_CORRECTIONS
from forge_exp.rl.losses.primitives import LossInputs, frac, log_ratio, sequence_log_ratio, token_mean

IS_MODES = ("tis", "mis")  # the modes that weight tokens (and move the family's ratio to π_train)


@dataclass(frozen=True)
class Corrected:
    """What a loss family computes on after the correction."""

    x: LossInputs  # the inputs, with the mask narrowed to the tokens that still count
    anchor: torch.Tensor  # [B, T] detached: what the family's ratio is taken against (π_gen or π_train)
    weight: torch.Tensor | None  # [B, T] detached weight on the policy term; None = 1
    metrics: dict[str, torch.Tensor]

    def weigh(self, per_token: torch.Tensor) -> torch.Tensor:
        """The policy term of each token times its weight."""
        # per_token: [B, T]
        return per_token if self.weight is None else self.weight * per_token  # [B, T]


@dataclass(frozen=True)
class RolloutCorrection:
    """The mode and its cap C; `per_sequence` for a family whose ratio is per sequence (GSPO: none or seq_mask)."""

    mode: str = "none"
    cap: float | None = None  # None: the mode's own (choices.DEFAULT_ROLLOUT_CAP)
    per_sequence: bool = False

    def __post_init__(self) -> None:  # (ranges are the schema's: rl/loss_options.py; this is the dispatch)
        if self.mode not in ROLLOUT_CORRECTIONS:
            raise ValueError(f"rollout_correction must be one of {list(ROLLOUT_CORRECTIONS)}, got {self.mode!r}")
        if self.cap is not None and not self.cap > 1:
            raise ValueError(f"rollout_cap must be > 1 (the band is [1/C, C]), got {self.cap}")
        if self.per_sequence and self.mode in IS_MODES:
            raise ValueError(f"rollout_correction={self.mode} weights tokens, but this loss's ratio is per sequence; "
                             "use none or seq_mask")

    @property
    def c(self) -> float:
        return self.cap if self.cap is not None else DEFAULT_ROLLOUT_CAP.get(self.mode, math.inf)

    def __call__(self, x: LossInputs) -> Corrected:
        if self.mode == "none":
            return Corrected(x, x.behavior_logprobs, None, {})
        mask = x.mask  # [B, T]
        log_rho = log_ratio(x.logprobs.detach(), x.behavior_logprobs)  # [B, T] log π_train/π_gen
        log_c = math.log(self.c)
        weight, truncated = None, torch.zeros_like(mask)
        if self.mode == "tis":
            keep = mask
            truncated = log_rho > log_c
            weight = log_rho.clamp(max=log_c).exp()  # min(ρ, C)
        elif self.mode == "mis":
            keep = mask & (log_rho.abs() <= log_c)
            weight = torch.where(keep, log_rho.exp(), torch.zeros((), dtype=log_rho.dtype, device=log_rho.device))
        else:  # seq_mask
            keep = mask & (sequence_log_ratio(log_rho, mask).abs() <= log_c)  # [B, T]: whole rows
        anchor = x.logprobs.detach() if self.mode in IS_MODES else x.behavior_logprobs
        rows = mask.any(-1)  # [B] sequences with a real token
        dropped_rows = rows & ~keep.any(-1)
        metrics = {
            "loss/correction_weight_mean": token_mean(torch.ones_like(log_rho) if weight is None else weight, keep),
            "loss/correction_truncated_frac": frac(truncated, mask),
            "loss/correction_dropped_frac": frac(mask & ~keep, mask),
            "loss/correction_dropped_seq_frac": (dropped_rows.sum() / rows.sum().clamp(min=1)).to(torch.float32),
        }
        return Corrected(dataclasses.replace(x, mask=keep), anchor, weight, {k: v.detach() for k, v in metrics.items()})
