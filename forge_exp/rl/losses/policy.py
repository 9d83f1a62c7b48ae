"""What the five policy-gradient families share around their own term: the knobs, parsed into the family's
torch-free dataclass (rl/loss_options.py, the schema of `algorithm.loss`), and from them the rollout correction, the
KL / entropy terms, the aggregation and the inputs to ask the trainer for; then, per call, the checked inputs, the
correction, and the standard metrics (primitives.finish). A family says only what its per-token term is.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import nn

from forge_exp.rl.loss_options import PolicyOptions
from forge_exp.rl.losses.correction import Corrected, RolloutCorrection
from forge_exp.rl.losses.primitives import Clipped, finish, policy_terms, prepare_inputs


class Term(NamedTuple):
    """A family's policy term on the corrected inputs, before the correction's weight and the aggregation."""

    per_token: torch.Tensor  # [B, T]
    ratio: torch.Tensor  # [B, T] the token importance ratio, for the metrics
    clipped: Clipped | None = None  # where a clip cut the gradient off; None: nowhere
    active: torch.Tensor | None = None  # [B, T] bool tokens with a policy gradient; None: A ≠ 0 and not clipped
    metrics: dict[str, torch.Tensor] | None = None  # the family's own (detached), after the standard ones


class PolicyLoss(nn.Module):
    """`Family(**knobs)`: the knobs are the family's `schema` fields (defaults and range checks there)."""

    schema: ClassVar[type[PolicyOptions]]
    per_sequence: ClassVar[bool] = False  # its ratio is per sequence (GSPO): rollout correction none | seq_mask

    def __init__(self, **knobs) -> None:
        super().__init__()
        self.options = o = self.schema(**knobs)
        self.correction = RolloutCorrection(o.rollout_correction, o.rollout_cap, per_sequence=self.per_sequence)
        # the trainer reads required_inputs (rl.losses.loss_inputs) to know what to compute
        self.regularizers, self.agg, self.required_inputs = policy_terms(
            o.beta, o.kl_estimator, o.entropy_coef, o.loss_agg, o.horizon
        )

    def term(self, c: Corrected) -> Term:
        """The family's own part: its per-token policy term on the corrected inputs `c.x`, its ratio taken against
        `c.anchor` (the behaviour logprobs, or the trainer's own under tis / mis)."""
        raise NotImplementedError

    def forward(
        self,
        logprobs: torch.Tensor,  # [B, T]
        behavior_logprobs: torch.Tensor,  # [B, T]
        advantages: torch.Tensor,  # [B, 1] ([B, T] where the family takes per-token advantages)
        padding_mask: torch.Tensor,  # [B, T]
        ref_logprobs: torch.Tensor | None = None,  # [B, T]
        entropy: torch.Tensor | None = None,  # [B, T]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x = prepare_inputs(logprobs, behavior_logprobs, advantages, padding_mask, ref_logprobs, entropy)
        c = self.correction(x)
        t = self.term(c)
        loss, metrics = finish(self.agg(c.weigh(t.per_token), c.x.mask), c.x, t.ratio, t.clipped, self.regularizers,
                               self.agg, active=t.active, extra=c.metrics)
        return loss, {**metrics, **(t.metrics or {})}
