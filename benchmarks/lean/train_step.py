"""The trainer's step alone, in one process without Monarch: what `trainer.train_step` costs at compare.py's shape
when nothing else runs, split into forward, loss, backward and clip + AdamW, on one intra-op thread (services=cpu's).

    .venv/bin/python benchmarks/lean/train_step.py [--steps 40] [--init DIR] [--out results/lean_train_step.json]

The batch is what a step of the tiny default trains on: 8 arithmetic prompts x 8 completions (prompts of one
length, no left padding), responses right-padded to 6 tokens with 2-4 real ones (the warm start's answers: TRL
logs a mean completion length of 3.5 at this shape). `--init` loads a warm start (default: compare.py's cache, else
a fresh model). Timings are medians after 5 warm-up steps.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from forge_exp.data.arithmetic import ArithmeticTask
from forge_exp.models.generate import left_pad
from forge_exp.models.tiny import TinyQwen3
from forge_exp.rl.losses import GRPOLoss
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers import update
from forge_exp.trainers.hf import HFTrainer

HERE = Path(__file__).resolve().parent
CACHE = HERE.parents[1] / ".runtime" / "lean-warmstart"


def batch_of(tokenizer, prompts: int = 8, group: int = 8, width: int = 6, seed: int = 0) -> TrainBatch:
    stream = ArithmeticTask(digits=2, ops="+", eval_size=10, seed=seed).train_stream()
    ids = [tokenizer.encode(next(stream).prompt) for _ in range(prompts) for _ in range(group)]
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(seed)
    n = len(ids)
    lengths = torch.randint(2, 5, (n,), generator=g)
    lengths[0] = width
    response_mask = torch.arange(width)[None] < lengths[:, None]  # [B, R]
    response_ids = torch.randint(5, len(tokenizer), (n, width), generator=g).masked_fill(~response_mask, 0)
    behaviour = (-torch.rand(n, width, generator=g) * 2).masked_fill(~response_mask, 0.0)
    return TrainBatch(prompt_ids, prompt_mask, response_ids, response_mask, behaviour, torch.randn(n, generator=g),
                      lengths == width, torch.zeros(n, dtype=torch.long), None, response_mask.clone())


def timed(into: dict, label: str, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            into[label].append(time.perf_counter() - t0)
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init", default=None)
    p.add_argument("--out", default=str(HERE.parent / "results" / "lean_train_step.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    init = args.init or next(iter(sorted(glob.glob(str(CACHE / "tiny-*")))), None)
    spec = TinyQwen3(path=init)
    trainer = HFTrainer(spec, GRPOLoss(beta=0.0), device=torch.device("cpu"), lr=1e-4, weight_decay=0.0,
                        init_path=init, loss_inputs=update.available_inputs(reference=False))
    batch = batch_of(trainer.tokenizer)

    phases: dict[str, list[float]] = defaultdict(list)
    update.sequence_logprobs = timed(phases, "forward (sequence_logprobs)", update.sequence_logprobs)
    update.call_loss = timed(phases, "loss", update.call_loss)
    update.step_if_finite = timed(phases, "clip + AdamW step", update.step_if_finite)
    backward = torch.Tensor.backward
    torch.Tensor.backward = timed(phases, "backward", backward)
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            trainer.train_step(batch, grad_accum=1, max_grad_norm=1.0, temperature=1.0, mask_truncated=False)
            phases["train_step"].append(time.perf_counter() - t0)
    finally:
        torch.Tensor.backward = backward
    result = {
        "command": "benchmarks/lean/train_step.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_avg_1min": os.getloadavg()[0],
        "batch": {"prompt": list(batch.prompt_ids.shape), "response": list(batch.response_ids.shape)},
        "init": init, "threads": torch.get_num_threads(),
        "median_ms": {k: round(statistics.median(v[5:]) * 1e3, 2) for k, v in phases.items()},
        "min_ms": {k: round(min(v) * 1e3, 2) for k, v in phases.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
