"""One optimizer step of the policy on a TrainBatch: recompute logprobs, call the loss, accumulate, clip, step.

Pure torch; the Trainer actor calls it. Micro-batches are weighted by their share of the batch's sequences, so with
token-mean losses and grad_accum > 1 the result is a sequence-weighted mean of per-micro-batch token means (the usual
approximation, exact when micro-batches hold equal token counts).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch

from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.rl.losses import call_loss
from forge_exp.rl.types import TrainBatch


@dataclass
class Policy:
    """What a training step works on. Weights stay float32 (master weights); `compute_dtype` is what the forward
    runs in, under autocast when it is lower (see actors/policy.py)."""

    device: torch.device
    model: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    loss: torch.nn.Module
    compute_dtype: torch.dtype = torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, hint: str) -> float:
    """Clip the gradient norm and step; a non-finite norm skips the step (weights stay finite) and raises."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"gradient norm is {grad_norm}: the step was skipped so the weights stay finite ({hint})")
    optimizer.step()
    return grad_norm


def available_inputs(beta: float) -> set[str]:
    """What the trainer can hand a loss (by argument name); ref_logprobs exists only when a reference model runs."""
    names = {"logprobs", "behavior_logprobs", "old_logprobs", "advantages", "padding_mask", "entropy"}
    return names | ({"ref_logprobs"} if beta > 0 else set())


def policy_update(
    policy: Policy,
    batch: TrainBatch,
    *,
    grad_accum: int,
    max_grad_norm: float,
    temperature: float,
    mask_truncated: bool = False,
) -> dict[str, float]:
    t0 = time.perf_counter()
    model, optimizer, device = policy.model, policy.optimizer, policy.device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    tokens = 0
    for mb in batch.split(grad_accum):
        mb = _to(mb, device)
        # The model's own tokens: environment insertions of a multi-turn episode are attended to but not trained on,
        # and stay out of the behaviour/reference ratios (the loss sees them masked).
        mask = mb.response_mask if mb.loss_mask is None else mb.loss_mask
        if mask_truncated:  # overlong filtering (DAPO): truncated completions carry no gradient
            mask = mask & ~mb.truncated[:, None]
        with policy.autocast():
            logprobs, entropy = sequence_logprobs(
                model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask, temperature
            )
        inputs = dict(
            logprobs=logprobs,
            behavior_logprobs=mb.behavior_logprobs,
            old_logprobs=mb.behavior_logprobs,
            advantages=mb.advantages[:, None],
            padding_mask=mask,
            entropy=entropy,
        )
        if mb.ref_logprobs is not None:
            inputs["ref_logprobs"] = mb.ref_logprobs
        loss, metrics = call_loss(policy.loss, **inputs)
        weight = len(mb) / len(batch)
        (loss * weight).backward()
        for k, v in {"loss/total": loss, **metrics}.items():
            sums[k] = sums.get(k, 0.0) + float(v.detach() if isinstance(v, torch.Tensor) else v) * weight
        sums["policy/entropy"] = sums.get("policy/entropy", 0.0) + float(
            (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
        ) * weight
        tokens += int(mb.response_mask.sum()) + int(mb.prompt_mask.sum())
    grad_norm = clip_and_step(model, optimizer, max_grad_norm, "check the rewards and algorithm.lr")
    seconds = time.perf_counter() - t0
    return {
        **sums,
        "train/grad_norm": grad_norm,
        "train/seconds": seconds,
        "train/tokens_per_s": tokens / max(seconds, 1e-9),
    }


def _to(batch: TrainBatch, device: torch.device) -> TrainBatch:
    if device.type == "cpu":
        return batch
    return TrainBatch(
        **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    )
