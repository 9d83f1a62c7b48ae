"""Pieces every app shares: held-out evaluation, the samplers, the trainer, the cached supervised warm start."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from forge_exp.apps.rollout import Samplers, rollout_kind, sample_groups, task_accuracy
from forge_exp.config.enums import plain
from forge_exp.rl.types import Problem
from forge_exp.runtime.services import Service


@dataclass(frozen=True)
class EvalPlan:
    """How a run evaluates, read once from the config (`eval.*`, the run's seed, the env's tool control)."""

    pass_k: int
    temperature: float  # pass@k's
    seed: int
    no_tool_control: bool  # the environment's tools can be switched off: also the accuracy without them

    @classmethod
    def of(cls, cfg) -> EvalPlan:
        return cls(cfg.eval.pass_k, cfg.eval.temperature, cfg.seed, cfg.env.tool_control)


async def evaluate(s: Samplers, problems: list[Problem], step: int, plan: EvalPlan) -> dict[str, float]:
    """Greedy accuracy on the held-out problems (and each task's, for a mix); with pass_k > 1 also pass@k at the
    plan's temperature (seeded by the run's seed and the step). The samplers' kind adds its own (a multi-turn run:
    how the policy uses its tools, and the accuracy without them). No held-out problems (dataset.eval_size=0): no
    metrics."""
    from forge_exp.driver.checkpoint import rollout_seed

    out: dict[str, float] = {}
    if not problems:
        return out
    groups, _ = await sample_groups(s, problems, 1, 0.0, 1.0)
    out["eval/accuracy"] = statistics.fmean(float(g.correct[0]) for g in groups)
    out["eval/reward"] = statistics.fmean(g.rewards[0] for g in groups)
    out.update(task_accuracy(groups, "eval"))  # a mix of tasks: each one's own (eval/<task>/accuracy)
    out.update(await s.eval_metrics(groups, problems, plan.no_tool_control))
    k = plan.pass_k
    if k > 1:
        groups, _ = await sample_groups(s, problems, k, plan.temperature, 1.0,
                                        seed=rollout_seed(plan.seed, -1 - step, 0))  # negative: evaluations' own
        out[f"eval/pass_at_{k}"] = statistics.fmean(  # pass@k; MLflow refuses '@' in a metric name
            float(any(g.correct)) for g in groups
        )
    return out


def samplers(cfg, generator: Service, scorers: dict[str, Service]) -> Samplers:
    """The run's samplers, of the env option's kind (scorers: spawn_scorers'), with what they read of the config."""
    return rollout_kind(cfg.env)(generator, scorers[cfg.env.scorer], response_budget(cfg),
                                 cfg.services.generator.in_flight, tuple(cfg.reward.functions))


def spawn_scorers(cfg, runtime) -> dict[str, Service]:
    """The service that scores the env option's episodes, by its name (env.scorer), spawned where `services` says:
    reward workers for a single-turn run, environment workers (which score their own episodes) for a multi-turn
    one."""
    return {cfg.env.scorer: rollout_kind(cfg.env).spawn_scorer(runtime, cfg.env, cfg.reward, cfg.model)}


def response_budget(cfg) -> int:
    """The most tokens a sample may hold after its prompt: one completion's, or a whole episode's."""
    return cfg.env.response_budget(cfg.dataset)


async def spawn_trainer(cfg, runtime, init_path: str | None, resume_step: int = 0,
                        lr_schedule: tuple[int, int] | None = None) -> Service:
    """The trainer service, told the inputs the algorithm's loss takes and the lr schedule ((warm-up steps, total
    steps); None: a constant lr): one process (trainer=hf), or a sharded engine on every process of the trainer
    mesh, one torch.distributed world (trainer=titan: nccl on GPUs, gloo on CPU)."""
    from forge_exp.actors.trainer import Trainer

    args = (cfg.trainer, cfg.model, cfg.algorithm, init_path, cfg.seed, cfg.algorithm.loss_inputs)
    kwargs = {"resume_step": resume_step, "lr_schedule": lr_schedule}
    if not cfg.trainer.collective:
        return runtime.spawn("trainer", Trainer, *args, **kwargs)
    degrees = cfg.parallelism.degrees(cfg.services.trainer.procs)
    backend = "nccl" if cfg.services.trainer.gpus else "gloo"
    return await runtime.spawn_collective("trainer", Trainer, *args, **kwargs, degrees=degrees, backend=backend)


def generator_sizes(cfg) -> dict[str, int]:
    """The generator knobs a config may leave null, from the run's shape: KV-cache rows for every batch that may be
    in flight at once, and room for the longest prompt plus the response budget."""
    longest = cfg.env.sequence_budget(cfg.dataset)
    return {"slots": cfg.algorithm.rows_in_flight, "max_len": longest, "max_model_len": longest}


def warm_start_dir(cfg) -> Path:
    """Cache key: what changes the warm-started weights (the model and its warm-start settings, the training task,
    the seed). Not where the cache is, nor the held-out split (the warm start trains on the train stream alone), nor
    model.lora (the warm start trains the whole base, and a LoRA run starts its adapters on the same one): changing
    those reuses the cached weights."""
    model, dataset = asdict(cfg.model), asdict(cfg.dataset)
    model.pop("lora", None)
    (model.get("warmstart") or {}).pop("cache_dir", None)
    for key in ("eval_size", "eval_path", "eval_split"):
        dataset.pop(key, None)
    parts = {"model": model, "dataset": dataset, "seed": cfg.seed}
    if cfg.env.warm_start_episodes:  # trained on scripted episodes of the environment instead
        parts["env"] = {k: getattr(cfg.env, k) for k in ("name", "chat_format", "demonstrations", "direct_fraction")}
    key = json.dumps(parts, sort_keys=True, default=plain)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = Path(cfg.model.warmstart.cache_dir or os.path.join(Path.home(), ".cache", "forge-exp", "warmstart"))
    return root / f"{cfg.model.name}-{digest}"


def wants_warm_start(cfg) -> bool:
    """Only a randomly initialised model needs one, and only it has the settings (config.model.WarmstartConfig)."""
    return cfg.model.needs_warm_start


async def warm_start(cfg, trainer: Service, dataset: Service, env: Service | None = None) -> dict[str, float]:
    """Supervised warm start of the trainer's weights on the training task, saved to warm_start_dir(cfg): on
    problems and their answers, or on scripted episodes the environment workers play (env.demonstrations)."""
    ws = cfg.model.warmstart
    problems = await dataset.route().sample.call_one(warm_start_draws(cfg))
    if cfg.env.warm_start_episodes:
        items = await env.route().demonstrations.call_one(problems, cfg.seed)
    else:
        items = problems
    return await trainer.route().warm_start.call_one(items, ws, str(warm_start_dir(cfg)), cfg.seed)


def warm_start_draws(cfg) -> int:
    """How many problems a warm start takes from the prompt stream."""
    ws = cfg.model.warmstart
    return cfg.env.warm_start_episodes or ws.steps * ws.batch_size


async def skip_warm_start(cfg, dataset: Service) -> None:
    """Draw the problems a warm start takes, and drop them (its weights came from the cache): RL then reads the
    prompts after the warm start's, as it does after a fresh one, so a cache hit changes nothing downstream."""
    await dataset.route().skip.call_one(warm_start_draws(cfg))
