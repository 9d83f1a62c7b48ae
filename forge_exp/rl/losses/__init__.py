"""Policy losses, one file per family, and the contract by which the trainer calls any loss.

The contract
------------
A loss is an `nn.Module` (or any callable) whose `forward` takes, *by name*, only the inputs it needs from:

    logprobs           [B, T]  policy logprobs of the response tokens (requires grad)      — trainer forward pass
    behavior_logprobs  [B, T]  logprobs under the generator that sampled them; alias old_logprobs — generator
    ref_logprobs       [B, T]  reference-model logprobs                                     — iff algorithm.beta > 0
    advantages         [B, 1]  broadcastable to [B, T] ([B] is accepted by the built-ins)   — rl/advantages.py
    padding_mask       [B, T]  bool / 0-1 float, True on the model's response tokens        — collate
    entropy            [B, T]  per-token policy entropy (requires grad)                     — trainer, when asked for

and returns either a scalar tensor (torchforge style: `forward(self, logprobs, ref_logprobs, advantages,
padding_mask)` plugs in unchanged) or `(loss, metrics)` with metrics a dict of floats / 0-dim tensors keyed
`loss/...`.

    loss_inputs(loss)                    the canonical names the loss requires: its `required_inputs` attribute
                                         when it has one (the built-ins: it depends on beta / entropy_coef),
                                         otherwise the forward parameters without a default
    check_loss_inputs(loss, available)   at start-up: ValueError naming the first missing input and what provides it
    call_loss(loss, **available)         passes only the names the forward takes (optional ones when present),
                                         normalises the return to (scalar loss, metrics)

Built-in losses (all return the standard metrics loss/policy, loss/kl, loss/entropy, loss/clip_frac_low,
loss/clip_frac_high, loss/clip_frac_dual, loss/ratio_mean, loss/ratio_max, loss/token_frac):
GRPOLoss (GRPO, Dr. GRPO, DAPO, dual clip), GSPOLoss, CISPOLoss, SAPOLoss, ReinforceLoss. Each takes
`rollout_correction` (none | tis | mis | seq_mask; GSPO none | seq_mask) and `rollout_cap`: correction.py, which
adds the loss/correction_* metrics when on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from forge_exp.rl.losses.cispo import CISPOLoss
from forge_exp.rl.losses.grpo import GRPOLoss
from forge_exp.rl.losses.gspo import GSPOLoss
from forge_exp.rl.losses.reinforce import ReinforceLoss
from forge_exp.rl.losses.sapo import SAPOLoss

# name → what provides it (completes "algorithm.loss asks for <name>, which ...")
LOSS_INPUTS: dict[str, str] = {
    "logprobs": "the trainer computes from the policy forward pass",
    "behavior_logprobs": "the generator returns with each completion (Completion.logprobs)",
    "ref_logprobs": "exists only when algorithm.beta > 0 (the reference model runs only then)",
    "advantages": "come from rl/advantages.py (algorithm.advantage)",
    "padding_mask": "the collate step builds (TrainBatch.loss_mask)",
    "entropy": "the trainer computes from the policy logits when the loss asks for it",
}
ALIASES: dict[str, str] = {"old_logprobs": "behavior_logprobs"}

__all__ = [
    "ALIASES",
    "CISPOLoss",
    "GRPOLoss",
    "GSPOLoss",
    "LOSS_INPUTS",
    "ReinforceLoss",
    "SAPOLoss",
    "call_loss",
    "check_loss_inputs",
    "loss_inputs",
]


def _canonical(name: str) -> str:
    return ALIASES.get(name, name)


def describe_loss(loss: Any) -> str:
    t = loss if inspect.isfunction(loss) else type(loss)
    return f"{t.__module__}.{t.__qualname__}"


def _signature(loss: Any) -> inspect.Signature:
    fn: Callable = loss.forward if isinstance(loss, torch.nn.Module) else loss
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cannot read the forward signature of loss {describe_loss(loss)}: {e}") from e


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def loss_inputs(loss: Any) -> set[str]:
    """The canonical names of the inputs `loss` requires (see the module docstring)."""
    declared = getattr(loss, "required_inputs", None)
    if declared is not None:
        return {_canonical(n) for n in declared}
    params = _signature(loss).parameters.values()
    return {_canonical(p.name) for p in params if p.kind in _NAMED and p.default is inspect.Parameter.empty}


def check_loss_inputs(loss: Any, available: set[str], key: str = "algorithm.loss") -> set[str]:
    """Raise ValueError, in one line, if `loss` requires an input that is unknown or not in `available`.
    Returns the required names."""
    available = {_canonical(n) for n in available}
    sig = _signature(loss)
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty:
            raise ValueError(f"{key} ({describe_loss(loss)}) takes '{p.name}' positionally only; inputs are passed by name")
    required = loss_inputs(loss)
    for name in sorted(required):
        if name not in LOSS_INPUTS:
            raise ValueError(
                f"{key} ({describe_loss(loss)}) asks for '{name}', which is not a loss input; "
                f"a loss may take only {sorted(LOSS_INPUTS)} (alias old_logprobs)"
            )
        if name not in available:
            raise ValueError(f"{key} ({describe_loss(loss)}) asks for {name}, which {LOSS_INPUTS[name]}")
    return required


def call_loss(loss: Any, **available: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Call `loss` with the inputs its forward names (None values count as absent); return (loss, metrics)."""
    given = {_canonical(k): v for k, v in available.items() if v is not None}
    check_loss_inputs(loss, set(given))
    params = _signature(loss).parameters
    kwargs = {p: given[_canonical(p)] for p, spec in params.items() if spec.kind in _NAMED and _canonical(p) in given}
    if any(spec.kind is inspect.Parameter.VAR_KEYWORD for spec in params.values()):
        kwargs.update({k: v for k, v in given.items() if k in LOSS_INPUTS and k not in kwargs})
    out = loss(**kwargs)

    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        value, metrics = out[0], dict(out[1])
    else:
        value, metrics = out, {}
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(
            f"algorithm.loss ({describe_loss(loss)}) returned {shape}; a loss returns a scalar tensor or (scalar, metrics)"
        )
    return value, metrics
