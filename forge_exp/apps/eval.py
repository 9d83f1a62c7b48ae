"""Evaluate a model alone, without training: `forge-exp mode=eval model.path=<checkpoint>`.

    held-out problems (dataset.eval_split, the first dataset.eval_size) ─▶ generator ─▶ reward workers
    (or environment workers, for a multi-turn env=)
    ─▶ greedy accuracy, and pass@k at eval.temperature when eval.pass_k > 1 ─▶ MLflow (step 0)

The same `evaluate` (apps/common.py) that GRPO runs every eval.every steps, so the numbers compare with a training
run's eval/accuracy. Any checkpoint this platform writes (an SFT model, a GRPO checkpoint, a warm start) or any
local HF model directory can be evaluated:

    forge-exp mode=eval model=qwen3_1_7b model.path=/models/Qwen3-1.7B dataset=gsm8k reward=math eval.pass_k=8
"""

from __future__ import annotations

import time

from forge_exp.apps.common import EvalPlan, RolloutPlan, evaluate
from forge_exp.runtime.build import build
from forge_exp.runtime.services import Runtime
from forge_exp.tracking.mlflow import Tracker


async def run(cfg, runtime: Runtime, tracker: Tracker, resume=None) -> dict[str, float]:
    problems = build(cfg.dataset, "dataset").eval_problems(build(cfg.model, "model").tokenizer())
    if not problems:
        raise ValueError(f"dataset {cfg.dataset.name} has no held-out problems to evaluate: set its eval split "
                         f"and a dataset.eval_size > 0 (null = the whole split)")
    plan = RolloutPlan.of(cfg)  # single- or multi-turn episodes, decided once
    s = plan.samplers(plan.spawn_generator(runtime), plan.spawn_scorer(runtime))
    tracker.begin()  # the MLflow run is created while the generator starts and evaluates (tracking/mlflow.py)
    t0 = time.perf_counter()
    metrics = await evaluate(s, problems, step=0, plan=EvalPlan.of(cfg))
    metrics.update({"eval/problems": float(len(problems)), "eval/seconds": time.perf_counter() - t0})
    tracker.log_metrics(metrics, step=0)
    print("forge-exp: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
    return metrics
