"""Pieces every app shares: held-out evaluation, the samplers, the trainer, the cached supervised warm start, the
reference model.

What each of them reads of the config is read once, when the app builds its run, into a typed view (`EvalPlan`,
`RolloutPlan`, `TrainerPlan`, `WarmStart`, `ReferencePlan`: each one's `of(cfg)`); the helpers take those views or
plain values."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Every actor the apps spawn is imported with the app, before any service starts: the dataset's actor runs in this
# process and imports transformers as it starts, and a module this thread imported at the same moment could find
# transformers half-initialised (its lazy modules are not thread-safe).
from forge_exp.actors.env import EnvWorker  # noqa: F401  (spawned by rollout.MultiTurn.spawn_scorer)
from forge_exp.actors.generator import Generator
from forge_exp.actors.reference import ReferenceModel
from forge_exp.actors.reward import RewardWorker  # noqa: F401  (spawned by rollout.SingleTurn.spawn_scorer)
from forge_exp.actors.trainer import Trainer
from forge_exp.apps.rollout import Samplers, rollout_kind, sample_groups, task_accuracy
from forge_exp.config.enums import plain
from forge_exp.rl.types import Problem
from forge_exp.runtime.services import Service

if TYPE_CHECKING:
    from forge_exp.config.algorithm import AlgorithmBase
    from forge_exp.config.backends import TrainerBackend
    from forge_exp.config.dataset import DatasetBase
    from forge_exp.config.env import EnvBase
    from forge_exp.config.model import ModelBase, WarmstartConfig
    from forge_exp.config.reward import RewardConfig
    from forge_exp.generators.options import EngineOptions


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


@dataclass(frozen=True)
class RolloutPlan:
    """How a run samples and scores episodes, decided once from the config: the protocol of the env option's kind
    (rollout_kind: single- or multi-turn), the generator it samples from, and what both read of the config."""

    kind: type[Samplers]
    env: EnvBase
    reward: RewardConfig
    model: ModelBase
    generator: EngineOptions
    seed: int
    response_budget: int  # the most tokens after a prompt: one completion's, or a whole episode's
    sizes: dict[str, int]  # generator_sizes'
    in_flight: int  # services.generator.in_flight

    @classmethod
    def of(cls, cfg) -> RolloutPlan:
        return cls(rollout_kind(cfg.env), cfg.env, cfg.reward, cfg.model, cfg.generator, cfg.seed,
                   cfg.env.response_budget(cfg.dataset), generator_sizes(cfg.algorithm, cfg.env, cfg.dataset),
                   cfg.services.generator.in_flight)

    def spawn_generator(self, runtime, init_path: str | None = None) -> Service:
        """The generator service, its weights from `init_path` (None: the model's own)."""
        return runtime.spawn("generator", Generator, self.generator, self.model, init_path, self.seed, self.sizes)

    def spawn_scorer(self, runtime) -> Service:
        """The service that scores the episodes, named as the env option says (env.scorer) and spawned where
        `services` says: reward workers for a single-turn run, environment workers (which score their own episodes)
        for a multi-turn one."""
        return self.kind.spawn_scorer(runtime, self.env, self.reward, self.model)

    def samplers(self, generator: Service, scorer: Service) -> Samplers:
        return self.kind(generator, scorer, self.response_budget, self.in_flight, tuple(self.reward.functions))


def generator_sizes(algorithm: AlgorithmBase, env: EnvBase, dataset: DatasetBase) -> dict[str, int]:
    """The generator knobs a config may leave null, from the run's shape: KV-cache rows for every batch that may be
    in flight at once, and room for the longest prompt plus the response budget."""
    longest = env.sequence_budget(dataset)
    return {"slots": algorithm.rows_in_flight, "max_len": longest, "max_model_len": longest}


@dataclass(frozen=True)
class TrainerPlan:
    """The trainer service's arguments, read once from the config: one process (trainer=hf), or a sharded engine
    on every process of the trainer mesh (trainer=titan), with its parallel degrees and torch.distributed backend."""

    trainer: TrainerBackend
    model: ModelBase
    algorithm: AlgorithmBase
    seed: int
    degrees: Any = None  # parallelism.degrees on the trainer's procs, for a collective engine; None: one process
    backend: str = "gloo"  # the collective engine's: nccl on GPUs, gloo on CPU

    @classmethod
    def of(cls, cfg) -> TrainerPlan:
        spec = cfg.services.trainer
        degrees = cfg.parallelism.degrees(spec.procs) if cfg.trainer.collective else None
        return cls(cfg.trainer, cfg.model, cfg.algorithm, cfg.seed, degrees, "nccl" if spec.gpus else "gloo")


async def spawn_trainer(runtime, plan: TrainerPlan, init_path: str | None, resume_step: int = 0,
                        lr_schedule: tuple[int, int] | None = None) -> Service:
    """The trainer service, told the inputs the algorithm's loss takes and the lr schedule ((warm-up steps, total
    steps); None: a constant lr)."""
    args = (plan.trainer, plan.model, plan.algorithm, init_path, plan.seed, plan.algorithm.loss_inputs)
    kwargs = {"resume_step": resume_step, "lr_schedule": lr_schedule}
    if plan.degrees is None:
        return runtime.spawn("trainer", Trainer, *args, **kwargs)
    return await runtime.spawn_collective("trainer", Trainer, *args, **kwargs, degrees=plan.degrees,
                                          backend=plan.backend)


@dataclass(frozen=True)
class WarmStart:
    """The supervised warm start of a randomly initialised model on the training task, cached (the first run trains
    and saves it, later runs load it): read once from the config. Only such a model has the settings
    (config.model.WarmstartConfig)."""

    settings: WarmstartConfig  # model.warmstart
    dir: Path  # the cache: warm_start_dir
    draws: int  # problems it takes from the prompt stream
    episodes: bool  # on scripted episodes the environment workers play (env.demonstrations), not bare answers
    seed: int

    @classmethod
    def of(cls, cfg) -> WarmStart | None:
        """The run's warm start, or None for a model that needs none."""
        if not cfg.model.needs_warm_start:
            return None
        ws, episodes = cfg.model.warmstart, cfg.env.warm_start_episodes
        draws = episodes or ws.steps * ws.batch_size
        return cls(ws, warm_start_dir(cfg.model, cfg.dataset, cfg.env, cfg.seed), draws, bool(episodes), cfg.seed)

    @property
    def cached(self) -> bool:
        return (self.dir / "config.json").exists()

    async def train(self, trainer: Service, dataset: Service, env: Service | None = None) -> dict[str, float]:
        """Train the trainer's weights and save them to the cache: on problems and their answers, or on the
        scripted episodes that `env` (the environment workers) plays."""
        problems = await dataset.route().sample.call_one(self.draws)
        items = await env.route().demonstrations.call_one(problems, self.seed) if self.episodes else problems
        return await trainer.route().warm_start.call_one(items, self.settings, str(self.dir), self.seed)

    async def skip(self, dataset: Service) -> None:
        """Draw the problems a warm start takes, and drop them (its weights came from the cache): RL then reads the
        prompts after the warm start's, as it does after a fresh one, so a cache hit changes nothing downstream."""
        await dataset.route().skip.call_one(self.draws)


@dataclass(frozen=True)
class ReferencePlan:
    """The KL term's reference model, read once from the config: the run's initial policy, held by a service of
    its own (the config's reference_service), by the trainer's engine (trainer.hosts_reference), or with LoRA the
    trainer's base with its adapters off. Each answers `logprobs`."""

    service: bool  # a ref_model service of its own
    hosted: bool  # a frozen copy the trainer's engine builds (trainer.hosts_reference)
    path: str | None  # the initial weights: the warm start's, or None (model.path, or the seeded initialisation)
    model: ModelBase
    temperature: float
    share_prompts: bool  # trainer.share_prompts: a group's prompt once in the service's forward too (titan's null: not
    # in a transformers service, where the mask is dense)

    @classmethod
    def of(cls, cfg, warm_start: WarmStart | None, resumed: bool) -> ReferencePlan | None:
        """None without the KL term. A resumed run's reference is its initial policy too (its trainer loads the
        checkpoint instead): a resume whose warm start cache is gone is an error before anything starts."""
        if not cfg.algorithm.needs_reference:
            return None
        path = None
        if warm_start is not None and cfg.model.lora.rank is None:
            if resumed and not warm_start.cached:
                raise ValueError(f"resume: the reference model (algorithm.beta > 0) is the run's initial policy, the "
                                 f"warm start cached in {warm_start.dir}, which is gone; restore it, or start a new run")
            path = str(warm_start.dir)
        return cls(cfg.reference_service, cfg.trainer_hosts_reference, path, cfg.model, cfg.algorithm.temperature,
                   bool(cfg.trainer.share_prompts))

    async def start(self, runtime, trainer: Service) -> Service:
        """The service that answers the reference calls (after any warm start: it may read its weights)."""
        if self.service:
            return runtime.spawn("ref_model", ReferenceModel, self.model, self.path, self.temperature,
                                 self.share_prompts)
        if self.hosted:
            await trainer.route().load_reference.call_one(self.path)
        return trainer


def warm_start_dir(model: ModelBase, dataset: DatasetBase, env: EnvBase, seed: int) -> Path:
    """Cache key: what changes the warm-started weights (the model and its warm-start settings, the training task,
    the seed). Not where the cache is, nor the held-out split (the warm start trains on the train stream alone), nor
    model.lora (the warm start trains the whole base, and a LoRA run starts its adapters on the same one): changing
    those reuses the cached weights."""
    model_key, dataset_key = asdict(model), asdict(dataset)
    model_key.pop("lora", None)
    (model_key.get("warmstart") or {}).pop("cache_dir", None)
    for key in ("eval_size", "eval_path", "eval_split"):
        dataset_key.pop(key, None)
    parts = {"model": model_key, "dataset": dataset_key, "seed": seed}
    if env.warm_start_episodes:  # trained on scripted episodes of the environment instead
        parts["env"] = {"name": env.name, "chat_format": env.chat_format, "demonstrations": env.demonstrations,
                        "direct_fraction": env.direct_fraction}
    key = json.dumps(parts, sort_keys=True, default=plain)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = Path(model.warmstart.cache_dir or os.path.join(Path.home(), ".cache", "forge-exp", "warmstart"))
    return root / f"{model.name}-{digest}"
