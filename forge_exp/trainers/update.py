"""One optimizer step of the policy on a TrainBatch: recompute logprobs, call the loss, accumulate, clip, step.

Pure torch. `train_step` is the step both trainers run (transformers in one process through `policy_update`, and
the sharded TorchTitan engine in trainers/titan.py); they differ only in how they compute logprobs, clip and
reduce metrics, which they pass in.

Micro-batches: the batch is cut into `shards × grad_accum` near-equal parts (sizes differ by at most one sequence);
data-parallel shard s runs parts [s·grad_accum, (s+1)·grad_accum). Each part's loss is weighted by its share of the
batch's sequences, and the data-parallel gradient reduction sums, so one step is the same function of the batch
whether it runs on one process with grad_accum = G·S or on S shards with grad_accum = G. With token-mean losses the
result is a sequence-weighted mean of per-part token means (the usual approximation, exact when parts hold equal
token counts).

Every step also measures the generator/trainer mismatch (rl/mismatch.py: mismatch/...) on the whole batch: the
logprobs the step computed, detached, against the behaviour logprobs, over the model's own tokens; under
mismatch/current/ for the episodes sampled at the trainer's version (`version`). Data-parallel ranks hand each
other their rows of the step's logprobs first (`gather_rows`), so every rank measures the same whole batch.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from forge_exp.models.device import host_floats
from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.models.packing import prompt_groups
from forge_exp.rl.losses import describe_loss, call_loss
from forge_exp.rl.mismatch import mismatch_metrics
from forge_exp.rl.types import TrainBatch

# (micro-batch on the trainer's device) → (logprobs [b, R], entropy [b, R]), differentiable
LogprobsFn = Callable[[TrainBatch], tuple[torch.Tensor, torch.Tensor]]


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
        return autocast(self.device, self.compute_dtype)


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The forward in `dtype` under autocast, or as it is in float32."""
    return contextlib.nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)


def step_if_finite(grad_norm: torch.Tensor | float, optimizer: torch.optim.Optimizer, hint: str) -> float:
    """Step unless the (already clipped) gradient norm is non-finite: then skip (weights stay finite) and raise."""
    grad_norm = float(grad_norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"gradient norm is {grad_norm}: the step was skipped so the weights stay finite ({hint})")
    optimizer.step()
    return grad_norm


def check_finite_loss(total: float, loss, optimizer: torch.optim.Optimizer, hint: str) -> None:
    """A step's loss (summed over its micro-batches, and over the data-parallel ranks: the same on every rank) must
    be finite: a loss of ±inf or NaN with a finite gradient would train on as if nothing were wrong. The step is
    skipped (weights and optimizer state unchanged) and FloatingPointError names the loss."""
    if not math.isfinite(total):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"algorithm.loss ({describe_loss(loss)}) is {total} on this step's batch: the step was "
                                 f"skipped so the weights stay finite ({hint})")


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, hint: str) -> float:
    """Clip the gradient norm and step; a non-finite norm skips the step (weights stay finite) and raises."""
    return step_if_finite(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm), optimizer, hint)


def available_inputs(reference: bool) -> set[str]:
    """What the trainer can hand a loss (by argument name); ref_logprobs only with a reference (the algorithm's
    needs_reference)."""
    names = {"logprobs", "behavior_logprobs", "old_logprobs", "advantages", "padding_mask", "entropy"}
    return names | ({"ref_logprobs"} if reference else set())


def micro_batches(
    batch: TrainBatch, grad_accum: int, shard: int = 0, shards: int = 1
) -> list[tuple[TrainBatch, float, slice]]:
    """Data-parallel shard `shard`'s micro-batches of `batch` with their weights (share of the batch's sequences)
    and the rows of `batch` each holds."""
    n, parts = len(batch), grad_accum * shards
    if shards > 1 and n < parts:  # every shard must run the same number of non-empty forwards (FSDP collectives)
        raise ValueError(
            f"a batch of {n} sequences cannot feed {shards} data-parallel trainer ranks x algorithm.grad_accum="
            f"{grad_accum} micro-batches; lower algorithm.grad_accum or train on more sequences per step"
        )
    bounds = [i * n // parts for i in range(parts + 1)]  # near-equal parts, sizes differ by at most one
    out = []
    for i in range(shard * grad_accum, (shard + 1) * grad_accum):
        lo, hi = bounds[i], bounds[i + 1]
        if hi > lo:
            out.append((batch.rows(slice(lo, hi)), (hi - lo) / n, slice(lo, hi)))
    return out


def by_prompt(batch: TrainBatch) -> tuple[TrainBatch, torch.Tensor]:
    """The batch with each prompt's rows adjacent (prompts in order of first appearance, a prompt's rows in their
    order), and the order taken. With `share_prompts` a micro-batch (or a data-parallel rank's share) then holds
    whole groups: the replay buffer hands a batch's rows over shuffled."""
    order = prompt_groups(batch.prompt_ids, batch.prompt_mask).argsort(stable=True)
    return batch.rows(order), order


def train_step(
    batch: TrainBatch,
    *,
    logprobs_fn: LogprobsFn,
    loss: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    clip: Callable[[], torch.Tensor | float],
    device: torch.device,
    grad_accum: int,
    mask_truncated: bool = False,
    shard: int = 0,
    shards: int = 1,
    reduce: Callable[[dict[str, float]], dict[str, float]] | None = None,
    gather_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    version: int | None = None,
) -> dict[str, float]:
    """One optimizer step of this rank's share of `batch` (see the module docstring). `clip()` clips the gradients
    and returns their global norm; `reduce` sums the metric dict over the data-parallel ranks and `gather_rows` a
    [B, R] tensor of which each rank filled its rows (None: one rank); `version` is the trainer's weight version."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, torch.Tensor | float] = {}  # device tensors until the one host read after the last micro-batch

    def add(key: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
        value = value.detach().double() if isinstance(value, torch.Tensor) else value
        sums[key] = sums.get(key, 0.0) + value * weight

    train_logprobs = None  # [B, R]: this rank's rows of the step's logprobs, detached (the others stay 0)
    for mb, weight, rows in micro_batches(batch, grad_accum, shard, shards):
        mb = to_device(mb, device)
        # The model's own tokens: environment insertions of a multi-turn episode are attended to but not trained on,
        # and stay out of the behaviour/reference ratios (the loss sees them masked).
        mask = mb.response_mask if mb.loss_mask is None else mb.loss_mask
        if mask_truncated:  # overlong filtering (DAPO): truncated completions carry no gradient
            mask = mask & ~mb.truncated[:, None]
        logprobs, entropy = logprobs_fn(mb)
        if train_logprobs is None:
            train_logprobs = logprobs.new_zeros(batch.behavior_logprobs.shape)
        train_logprobs[rows] = logprobs.detach()
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
        value, metrics = call_loss(loss, **inputs)
        (value * weight).backward()
        for k, v in {"loss/total": value, **metrics}.items():
            add(k, v, weight)
        add("policy/entropy", (entropy.detach() * mask).sum() / mask.sum().clamp(min=1), weight)
        add("train/tokens", mb.response_mask.sum() + mb.prompt_mask.sum())
    # No host read until here, so the micro-batches queue back to back; then one read holds the metrics and the
    # clipped gradient's norm (a non-finite loss skips the step whatever the norm says).
    grad_norm = clip()
    read = host_floats({**sums, "train/grad_norm": grad_norm})
    grad_norm = read.pop("train/grad_norm")
    sums = reduce(read) if reduce is not None else read
    check_finite_loss(sums["loss/total"], loss, optimizer, "check the loss, the rewards and algorithm.lr")
    sums.update(_mismatch(batch, train_logprobs if gather_rows is None else gather_rows(train_logprobs), version))
    grad_norm = step_if_finite(grad_norm, optimizer, "check the rewards and algorithm.lr")
    seconds = time.perf_counter() - t0
    tokens = sums.pop("train/tokens", 0.0)
    return {**sums, "train/grad_norm": grad_norm, "train/seconds": seconds, "train/tokens_per_s": tokens / max(seconds, 1e-9)}


def _mismatch(batch: TrainBatch, train_logprobs: torch.Tensor, version: int | None) -> dict[str, float]:
    """rl/mismatch.py's metrics of the whole batch, over the model's own tokens (overlong-filtered ones too)."""
    device = train_logprobs.device
    own = batch.response_mask if batch.loss_mask is None else batch.loss_mask
    current = None if version is None else batch.policy_versions == version
    return mismatch_metrics(train_logprobs, batch.behavior_logprobs.to(device), own.to(device),
                            None if current is None else current.to(device))


def policy_update(
    policy: Policy,
    batch: TrainBatch,
    *,
    grad_accum: int,
    max_grad_norm: float,
    temperature: float,
    mask_truncated: bool = False,
    version: int | None = None,
    share_prompts: bool = False,
) -> dict[str, float]:
    """The transformers trainer's step: `train_step` on one process with the HF model's logprobs."""
    model = policy.model
    model.train()

    def logprobs_fn(mb: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with policy.autocast():
            return sequence_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask, temperature,
                                     share_prompts=share_prompts)

    return train_step(
        by_prompt(batch)[0] if share_prompts else batch,
        logprobs_fn=logprobs_fn,
        loss=policy.loss,
        optimizer=policy.optimizer,
        clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm),
        device=policy.device,
        grad_accum=grad_accum,
        mask_truncated=mask_truncated,
        version=version,
    )


def to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    if device.type == "cpu":
        return batch
    return TrainBatch(
        **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    )
