"""Pieces every app shares: held-out evaluation, the cached supervised warm start, metric averaging."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path

from forge_exp.config.enums import plain
from forge_exp.rl.types import Problem
from forge_exp.runtime.services import Service


async def evaluate(cfg, generator: Service, reward: Service, problems: list[Problem], step: int) -> dict[str, float]:
    """Greedy accuracy on the held-out problems; with eval.pass_k > 1 also pass@k at eval.temperature (seeded by
    the run's seed and the step). No held-out problems (dataset.eval_size=0): no metrics."""
    from forge_exp.apps.checkpoint import rollout_seed

    out: dict[str, float] = {}
    if not problems:
        return out
    groups, _ = await generator.route().generate.call_one(problems, 1, 0.0, 1.0, cfg.dataset.max_new_tokens)
    groups, _ = await reward.route().score.call_one(groups)
    out["eval/accuracy"] = statistics.fmean(float(g.correct[0]) for g in groups)
    out["eval/reward"] = statistics.fmean(g.rewards[0] for g in groups)
    k = cfg.eval.pass_k
    if k > 1:
        groups, _ = await generator.route().generate.call_one(
            problems, k, cfg.eval.temperature, 1.0, cfg.dataset.max_new_tokens,
            seed=rollout_seed(cfg.seed, -1 - step, 0),  # (negative batches: the evaluations' own seeds)
        )
        groups, _ = await reward.route().score.call_one(groups)
        out[f"eval/pass_at_{k}"] = statistics.fmean(  # pass@k; MLflow refuses '@' in a metric name
            float(any(g.correct)) for g in groups
        )
    return out


async def spawn_trainer(cfg, runtime, init_path: str | None, resume_step: int = 0, total_steps: int = 0) -> Service:
    """The trainer service: one process (trainer=hf), or a sharded engine on every process of the trainer mesh, one
    torch.distributed world (trainer=titan: nccl on GPUs, gloo on CPU)."""
    from forge_exp.actors.trainer import Trainer

    args = (cfg.trainer, cfg.model, cfg.algorithm, init_path, cfg.seed)
    kwargs = {"resume_step": resume_step, "total_steps": total_steps}
    if not cfg.trainer.collective:
        return runtime.spawn("trainer", Trainer, *args, **kwargs)
    degrees = cfg.parallelism.degrees(cfg.services.trainer.procs)
    backend = "nccl" if cfg.services.trainer.gpus else "gloo"
    return await runtime.spawn_collective("trainer", Trainer, *args, **kwargs, degrees=degrees, backend=backend)


def generator_sizes(cfg) -> dict[str, int]:
    """The generator knobs a config may leave null, from the run's shape: KV-cache rows for every batch that may be
    in flight at once, and room for the longest prompt plus the response budget."""
    a = cfg.algorithm
    rows = a.prompts_per_step * a.group_size * (a.max_policy_age + 1) if hasattr(a, "group_size") else 64
    longest = cfg.dataset.prompt_budget + cfg.dataset.max_new_tokens
    return {"slots": rows, "max_len": longest, "max_model_len": longest}


def warm_start_dir(cfg) -> Path:
    """Cache key: everything that changes the warm-started weights (model and its warm-start settings, task,
    seed)."""
    key = json.dumps({"model": asdict(cfg.model), "dataset": asdict(cfg.dataset), "seed": cfg.seed},
                     sort_keys=True, default=plain)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = Path(cfg.model.warmstart.cache_dir or os.path.join(Path.home(), ".cache", "forge-exp", "warmstart"))
    return root / f"{cfg.model.name}-{digest}"


def wants_warm_start(cfg) -> bool:
    """Only a randomly initialised model needs one, and only it has the settings (config.model.WarmstartConfig)."""
    ws = getattr(cfg.model, "warmstart", None)
    return ws is not None and ws.steps > 0 and not cfg.model.path


async def warm_start(cfg, trainer: Service, dataset: Service) -> dict[str, float]:
    """Supervised warm start of the trainer's weights on the training task, saved to warm_start_dir(cfg)."""
    ws = cfg.model.warmstart
    problems = await dataset.route().sample.call_one(ws.steps * ws.batch_size)
    return await trainer.route().warm_start.call_one(problems, ws, str(warm_start_dir(cfg)))


async def skip_warm_start(cfg, dataset: Service) -> None:
    """Draw the problems a warm start takes, and drop them (its weights came from the cache)."""
    ws = cfg.model.warmstart
    await dataset.route().sample.call_one(ws.steps * ws.batch_size)
