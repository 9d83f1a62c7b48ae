"""Supervised fine-tuning: next-token likelihood of the assistant's tokens, on packed rows.

    build:  rows → examples (loss mask on assistant tokens) → packed rows, in this process (data/sft.py);
            the trainer on the `trainer` mesh (actors/trainer.py: sft_step, sft_eval)
    loop over steps:
        next batch of packed rows ─▶ trainer.train_step ─▶ loss, lr, grad norm, token accuracy
        every eval.every steps (and at the start and the end): loss on the eval split
        every checkpoint.every steps: a resumable checkpoint (weights + optimizer + step)
    at the end: the policy in HF format in <checkpoint.dir>/final; `model.path=<it>` starts GRPO from it

    forge-exp algorithm=sft dataset=jsonl dataset.path=/data/{split}.jsonl steps=500

The warm start (model.warmstart) is a GRPO-run feature and is not used here: SFT starts from `model` as configured.
"""

from __future__ import annotations

import time
from pathlib import Path

from forge_exp.apps.common import TrainerPlan, spawn_trainer
from forge_exp.data.sft import SFTData, describe
from forge_exp.driver.checkpoint import ResumeState
from forge_exp.driver.steps import Steps
from forge_exp.runtime.build import build
from forge_exp.runtime.services import Runtime, Service
from forge_exp.tracking.mlflow import Tracker

FINAL = "final"  # <checkpoint.dir>/final: the model at the end, HF format, no optimizer state
METADATA = "forge_exp_sft.json"


async def run(cfg, runtime: Runtime, tracker: Tracker, resume: ResumeState | None = None) -> dict[str, float]:
    a = cfg.algorithm
    data = SFTData(build(cfg.dataset, "dataset"), build(cfg.model, "model").tokenizer(), a.max_seq_len,
                   a.batch_size, a.packing)
    heldout = data.eval_batches()
    batches = data.train_batches(skip=resume.step if resume else 0)  # seeded: a resumed run sees the same ones
    trainer = await spawn_trainer(runtime, TrainerPlan.of(cfg), str(resume.path) if resume else None,
                                  resume.step if resume else 0, lr_schedule=(a.warmup_steps, cfg.steps))
    tracker.begin()  # the trainer is up: the MLflow run is created while it works (tracking/mlflow.py)
    steps = Steps("sft", cfg.steps, tracker, trainer, cfg.checkpoint, cfg.eval.every, cfg.progress, resume)
    start = await steps.opening(lambda: evaluate(trainer, heldout), "eval/loss" if heldout else None)
    metrics: dict[str, float] = {}
    try:
        for step in steps:
            t0 = time.perf_counter()
            batch = next(batches)
            if step == steps.first:
                tracker.log_table(describe(batch, data.tokenizer), "samples/sft_examples.json")
            metrics = await trainer.route().sft_step.call_one(batch)
            metrics.update(data.metrics())
            metrics["time/step_seconds"] = time.perf_counter() - t0
            if steps.eval_due(step):
                metrics.update(await evaluate(trainer, heldout))
            await steps.logged(step, metrics)  # and a checkpoint every checkpoint.every steps
            steps.advance(loss=f"{metrics['loss/total']:.3f}", lr=f"{metrics['train/lr']:.2e}")
    finally:
        steps.close()
    end = await evaluate(trainer, heldout)
    tracker.log_metrics(end, step=cfg.steps)
    final = Path(cfg.checkpoint.dir or Path(cfg.output_dir or ".") / "checkpoints") / FINAL
    meta = {METADATA: {"run_id": tracker.run_id, "steps": cfg.steps, **end}}
    await trainer.route().save.call_one(str(final), meta, False)
    tracker.set_tags({"forge_exp.sft.final_checkpoint": str(final)})
    print(f"forge-exp: SFT model (HF format) in {final}\n  start GRPO from it: forge-exp model.path={final} ...")
    summary = {"train/loss_end": metrics.get("loss/total", float("nan"))}
    if heldout:
        summary.update({"eval/loss_start": start["eval/loss"], "eval/loss_end": end["eval/loss"]})
    return summary


async def evaluate(trainer: Service, heldout: list) -> dict[str, float]:
    """Loss on the eval rows ({} without an eval split)."""
    return await trainer.route().sft_eval.call_one(heldout) if heldout else {}
