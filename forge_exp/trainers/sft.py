"""The supervised step (`algorithm=sft`): next-token likelihood of the target tokens of packed rows (data/sft.py),
and the loss on eval rows. Plain torch, tested without a process; trainers/hf.py runs it."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from forge_exp.data.sft import SFTBatch
from forge_exp.rl.losses import call_loss
from forge_exp.trainers.update import check_finite_loss, clip_and_step

SFT_INPUTS = {"logprobs", "padding_mask"}  # what the SFT step can hand a loss (padding_mask: the target tokens)


def token_logprobs(model: torch.nn.Module, batch: SFTBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logprobs [B, T], correct [B, T] bool)`: log π(token t | the tokens before it in its own example) and
    whether it is the argmax, for t ≥ 1; column 0 (predicted by nothing) is 0 / False.

    Packed rows pass no attention mask: transformers derives the per-example causal mask from the position ids.
    TODO(researcher): for 150k-token vocabularies at long max_seq_len, compute the head only on target positions
    (or chunk over T) to bound the [B, T, V] logits.
    """
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()  # [B, T-1, V]: column t predicts token t+1
    nxt = batch.input_ids[:, 1:]
    lp = -F.cross_entropy(logits.reshape(-1, logits.shape[-1]), nxt.reshape(-1), reduction="none").view_as(nxt)
    with torch.no_grad():
        correct = logits.argmax(-1) == nxt
    return F.pad(lp, (1, 0)), F.pad(correct, (1, 0))


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn,
    batch: SFTBatch,
    *,
    grad_accum: int,
    max_grad_norm: float,
) -> dict[str, float]:
    """One optimizer step on `batch` at the optimizer's current lr. Micro-batches are weighted by their share of the
    batch's target tokens, so the step minimises the token mean over the whole batch whatever grad_accum is."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    model.train()
    lr = optimizer.param_groups[0]["lr"]
    optimizer.zero_grad(set_to_none=True)
    total = max(batch.num_targets, 1)
    sums: dict[str, float] = {}
    for mb in batch.split(grad_accum):
        mb = mb.to(device)
        logprobs, correct = token_logprobs(model, mb)
        loss, metrics = call_loss(loss_fn, logprobs=logprobs, padding_mask=mb.targets)
        weight = int(mb.targets.sum()) / total
        (loss * weight).backward()
        accuracy = (correct & mb.targets).sum() / mb.targets.sum().clamp(min=1)
        metrics = {"loss/total": loss, **metrics, "train/token_accuracy": accuracy}
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v.detach() if isinstance(v, torch.Tensor) else v) * weight
    check_finite_loss(sums["loss/total"], loss_fn, optimizer, "lower algorithm.lr or check the data")
    grad_norm = clip_and_step(model, optimizer, max_grad_norm, "lower algorithm.lr or check the data")
    seconds = time.perf_counter() - t0
    tokens = int(batch.input_ids.numel() if batch.attention_mask is None else batch.attention_mask.sum())
    sums.pop("loss/target_tokens", None)
    return {
        **sums,
        "train/lr": lr,
        "train/grad_norm": grad_norm,
        "train/target_tokens": float(batch.num_targets),
        "train/tokens": float(tokens),
        "train/examples": float(batch.examples),
        "train/seconds": seconds,
        "train/tokens_per_s": tokens / max(seconds, 1e-9),
    }


@torch.no_grad()
def sft_eval(model: torch.nn.Module, batches: list[SFTBatch]) -> dict[str, float]:
    """Token-mean negative log-likelihood (and argmax accuracy) of the target tokens over all `batches`."""
    device = next(model.parameters()).device
    model.eval()
    nll, correct, count = 0.0, 0, 0
    for batch in batches:
        batch = batch.to(device)
        logprobs, right = token_logprobs(model, batch)
        nll -= float(logprobs[batch.targets].sum())
        correct += int((right & batch.targets).sum())
        count += batch.num_targets
    loss = nll / max(count, 1)
    return {
        "eval/loss": loss,
        "eval/perplexity": math.exp(min(loss, 50.0)),
        "eval/token_accuracy": correct / max(count, 1),
        "eval/target_tokens": float(count),
    }
