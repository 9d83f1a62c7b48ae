"""Supervised warm start: teach a fresh model the task before RL, and stop while RL still has work to do.

RL from a random model never sees a reward; a short supervised phase on `prompt + target + <eos>` (loss on the
answer and EOS tokens only) gets it to partial accuracy. Where it stops matters more than how long it runs: on the
arithmetic task a tiny model's accuracy stays near zero for a few hundred steps and then rises steeply, and the
step at which it rises moves a lot from seed to seed (30% was reached after 330, 449 and 738 steps for seeds 0-2 of
the default experiment). So besides a step budget the warm start takes a `target_accuracy`: it stops as soon as the
model answers that fraction of its training problems exactly, which puts every seed at the same starting accuracy.

The learning rate is constant after a short warmup, with no decay: a warm start annealed to a small lr ends in a
sharp state that RL's noisier updates knock back (measured on the default task: greedy accuracy 0.24 → 0.09 after
GRPO at lr 1e-4), while a model stopped mid-learning at constant lr is one GRPO improves.

The accuracy is measured for free from the training forward pass, before the update on that batch: a sequence
counts as correct when the argmax at every answer position (given the correct prefix) is the target token — which
is exactly "greedy decoding reproduces the target", i.e. greedy accuracy on problems it has not been updated on yet.

Caching of the result (an HF checkpoint keyed by a hash of the configs) lives with the app: apps/common.py.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from forge_exp.rl.types import Problem

if TYPE_CHECKING:  # only annotations here: the modeling code loads with the model (models/hf.py)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def collate_sft(
    problems: list[Problem], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(ids [B, T], attention_mask [B, T] bool, loss_mask [B, T] bool)`, right-padded; loss_mask marks the target
    and EOS tokens (the tokens the model must produce)."""
    rows, answer_starts = [], []
    for p in problems:
        prompt = tokenizer(p.prompt)["input_ids"]
        answer = tokenizer(p.target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        answer_starts.append(len(prompt))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, start) in enumerate(zip(rows, answer_starts)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
        loss_mask[i, start : len(row)] = True
    return ids, mask, loss_mask


def warmstart(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Iterable[Problem],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    target_accuracy: float | None = None,
    accuracy_window: int = 8,
    warmup_steps: int = 10,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    collate: Callable[[list, PreTrainedTokenizerBase], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = collate_sft,
) -> dict[str, float]:
    """Train `model` in place with AdamW on `batch_size` problems per step (linear warmup, then constant `lr`) for
    at most `steps` steps, or until the exact-answer accuracy of the last `accuracy_window` batches (measured
    before each update) reaches `target_accuracy`. Returns metrics under `warmstart/`; the model is left in eval
    mode. `collate` turns a batch of items into `(ids, attention_mask, loss_mask)` (collate_sft's layout); other
    items than Problems plug in there, e.g. multi-turn demonstrations (data/tool_arithmetic.py)."""
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"warm-start target_accuracy must be in (0, 1], got {target_accuracy}")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    stream = iter(problems)
    recent: deque[float] = deque(maxlen=accuracy_window)
    losses: list[float] = []
    tokens, reached, start = 0, False, time.perf_counter()
    model.train()
    for step in range(steps):
        batch = list(itertools.islice(stream, batch_size))
        if not batch:
            break
        ids, mask, loss_mask = (t.to(device) for t in collate(batch, tokenizer))
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        targets, target_mask = ids[:, 1:], loss_mask[:, 1:]  # the logits at t predict token t+1
        token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        loss = (token_loss * target_mask).sum() / target_mask.sum()
        with torch.no_grad():
            wrong = (logits.argmax(-1) != targets) & target_mask
            recent.append(float((~wrong.any(-1)).float().mean()))
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / max(1, warmup_steps))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(loss.item())
        tokens += int(mask.sum())
        if target_accuracy is not None and len(recent) == accuracy_window and _mean(recent) >= target_accuracy:
            reached = True
            break
    model.eval()
    seconds = time.perf_counter() - start
    tail = losses[-accuracy_window:]
    return {
        "warmstart/steps": float(len(losses)),
        "warmstart/loss": _mean(tail) if tail else float("nan"),
        "warmstart/accuracy": _mean(recent) if recent else float("nan"),
        "warmstart/reached_target": float(reached),
        "warmstart/seconds": seconds,
        "warmstart/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
    }


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)
