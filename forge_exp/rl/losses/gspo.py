"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, Qwen, arXiv 2507.18071).

The importance ratio and its clip move from tokens to whole sequences (eq. 5–7):

    s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|) = exp( 1/|y_i| Σ_t log r_{i,t} )
    J   = 1/G Σ_i min( s_i·A_i, clip(s_i, 1 − ε_low, 1 + ε_high)·A_i )      (paper: ε_low 3e-4, ε_high 4e-4)

GSPO-token (eq. 13–14) allows per-token advantages A_{i,t}:

    s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]
    J       = 1/G Σ_i 1/|y_i| Σ_t min( s_{i,t}·A_{i,t}, clip(s_{i,t})·A_{i,t} )

With one advantage per sequence both give the same value and gradient (tested).

Departures from the paper:
- π_old is the generator's behaviour logprobs (see grpo.py); the token log-ratios are clamped to ±20.
- The per-sequence term is spread over the sequence's tokens and aggregated with `loss_agg`; the paper's
  objective is loss_agg = seq_mean (the default). token_mean weights sequences by length.
- Optional β·KL and entropy bonus (both 0 in the paper), aggregated like the policy term.
- Clip fractions count tokens (all tokens of a clipped sequence), as the paper's Figure 2 does.
- Optional rollout correction: none or seq_mask (correction.py). s_i at the step is the geometric-mean ratio that
  seq_mask bounds; tis and mis weight tokens, which a per-sequence ratio has no place for: refused.
"""

from __future__ import annotations

import torch

from forge_exp.rl.loss_options import GSPOOptions
from forge_exp.rl.losses.correction import Corrected
from forge_exp.rl.losses.policy import PolicyLoss, Term
from forge_exp.rl.losses.primitives import Clipped, clipped_surrogate, log_ratio, seq_mean, sequence_log_ratio


class GSPOLoss(PolicyLoss):
    """Sequence-level clipped surrogate (GSPO), or GSPO-token with token_level=True ([B, T] advantages allowed)."""

    schema = GSPOOptions
    per_sequence = True

    def term(self, c: Corrected) -> Term:
        x, o = c.x, self.options  # (anchor: the behaviour logprobs, as none and seq_mask keep it)
        token_lr = log_ratio(x.logprobs, c.anchor)  # [B, T]
        seq_lr = sequence_log_ratio(token_lr, x.mask)  # [B, 1]
        if o.token_level:
            # value s_i on every token, gradient s_i · ∇log π_θ(y_t)
            s = torch.exp(seq_lr.detach() + x.logprobs - x.logprobs.detach())  # [B, T]
        else:
            if x.advantages.shape[-1] != 1:
                raise ValueError(
                    "GSPO (sequence level) takes one advantage per sequence, got [B, T] advantages; "
                    "set algorithm.loss.token_level=true for per-token advantages"
                )
            s = torch.exp(seq_lr)  # [B, 1]
        per_seq, clipped = clipped_surrogate(s, x.advantages, o.clip_low, o.clip_high)  # [B, 1] or [B, T]
        clipped = Clipped(*(f.expand_as(x.mask) for f in (clipped.low, clipped.high, clipped.dual)))
        seq_rows = torch.exp(seq_lr.detach()).expand_as(x.logprobs)  # [B, T]
        return Term(per_seq.expand_as(x.logprobs), token_lr.exp(), clipped,
                    metrics={"loss/seq_ratio_mean": seq_mean(seq_rows, x.mask)})
