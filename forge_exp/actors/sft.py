"""SFT trainer service (`algorithm=sft`): owns the policy and its optimizer on the `trainer` mesh; one supervised
step per batch of packed rows (data/sft.py), the loss on the eval rows, HF-format checkpoints.

The trainer-mesh counterpart of actors/trainer.py. The step itself is plain torch — `token_logprobs`,
`sft_update`, `sft_eval` and `lr_at` below take no process and are tested directly; the actor holds the state and
calls them.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from monarch.actor import Actor, endpoint

from forge_exp.actors.policy import load_policy
from forge_exp.config.algorithm import AlgorithmConfig
from forge_exp.config.model import ModelConfig
from forge_exp.data.sft import SFTBatch
from forge_exp.models.checkpoint import save_hf_checkpoint
from forge_exp.rl.losses import call_loss
from forge_exp.rl.update import clip_and_step

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


def lr_at(step: int, lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to 10% of lr at total_steps (step counts from 0)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn,
    batch: SFTBatch,
    *,
    grad_accum: int,
    max_grad_norm: float,
    lr: float,
) -> dict[str, float]:
    """One optimizer step on `batch`. Micro-batches are weighted by their share of the batch's target tokens, so
    the step minimises the token mean over the whole batch whatever grad_accum is."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    model.train()
    for group in optimizer.param_groups:
        group["lr"] = lr
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


class SFTTrainer(Actor):
    def __init__(
        self,
        model: ModelConfig,
        algorithm: AlgorithmConfig,
        total_steps: int,
        init_path: str | None,
        seed: int,
        resume_step: int = 0,
        *,
        devices,
        threads,
    ):
        policy = load_policy(model, algorithm, init_path, seed, resume_step, SFT_INPUTS, devices, threads)
        self.model, self.tokenizer, self.optimizer, self.loss = policy.model, policy.tokenizer, policy.optimizer, policy.loss
        self.algorithm = algorithm
        self.total_steps = total_steps
        self.step = resume_step

    @endpoint
    async def train_step(self, batch: SFTBatch) -> dict[str, float]:
        a = self.algorithm
        lr = lr_at(self.step, a.lr, a.warmup_steps, self.total_steps)
        metrics = sft_update(
            self.model, self.optimizer, self.loss, batch,
            grad_accum=a.grad_accum, max_grad_norm=a.max_grad_norm, lr=lr,
        )
        self.step += 1
        return metrics

    @endpoint
    async def evaluate(self, batches: list[SFTBatch]) -> dict[str, float]:
        return sft_eval(self.model, batches)

    @endpoint
    async def save(self, directory: str, metadata: dict | None = None, optimizer: bool = True) -> str:
        """HF-format weights + tokenizer (+ optimizer state for resuming, and metadata files), written atomically."""
        return str(save_hf_checkpoint(
            self.model, self.tokenizer, directory, metadata, optimizer=self.optimizer if optimizer else None
        ))
