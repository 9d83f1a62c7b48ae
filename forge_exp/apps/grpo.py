"""GRPO, asynchronous: rollouts and training overlap, off-policy by at most `algorithm.max_policy_age` versions
(or take turns: `max_policy_age=0`, or `algorithm.rollout_waves`).

    rollouts (concurrently):  prompts → generator (group_size each) → reward workers → filters → advantages
                              → [reference logprobs] → replay buffer, batches in order
                              (each batch a task of its own: up to max_policy_age + 1 of them generate at once)
                              (a multi-turn env: prompts → environment workers, each turn through the generator,
                              the episodes scored by the environment: apps/rollout.py)
    training, each step:      replay buffer → trainer.train_step → weights v+1 → every generator replica

The app talks to services through handles (runtime/services.py) and never imports monarch. Building the services
is `build()`; the algorithm is `rollouts()` and `train()`. What runs around the steps (the policy-age gate, the
next batch taken while a step trains, checkpoints, stop signals, progress) is the driver's (driver/overlap.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from forge_exp.actors.dataset import DatasetService
from forge_exp.actors.replay_buffer import ReplayBufferService
from forge_exp.apps.common import (EvalPlan, ReferencePlan, RolloutPlan, TrainerPlan, WarmStart, evaluate,
                                   spawn_trainer)
from forge_exp.apps.rollout import Samplers, sample_groups
from forge_exp.config.algorithm import RLAlgorithm
from forge_exp.data.collate import collate_episodes
from forge_exp.driver.checkpoint import ResumeState, rollout_seed
from forge_exp.driver.faults import RewardWatch
from forge_exp.driver.overlap import Overlap, restore
from forge_exp.driver.steps import Steps
from forge_exp.rl.episodes import group_advantages, penalize_overlong, to_episodes
from forge_exp.rl.filters import DynamicSampling
from forge_exp.rl.types import Group
from forge_exp.runtime.services import Runtime, Service
from forge_exp.runtime.timeline import Timeline
from forge_exp.tracking.mlflow import Tracker


@dataclass(frozen=True)
class GRPORun:
    """What the loop reads of the config, decided once when the run is built."""

    algorithm: RLAlgorithm  # batch, sampling, filters, advantages; needs_reference: the KL term's reference
    steps: int
    seed: int
    eval: EvalPlan
    eval_every: int
    checkpoint: Any  # the checkpoint node: dir, every, keep
    progress: bool
    reward_failures: tuple[float, int]  # reward.max_failure_rate, reward.failure_steps: then the run ends

    @classmethod
    def of(cls, cfg) -> GRPORun:
        return cls(cfg.algorithm, cfg.steps, cfg.seed, EvalPlan.of(cfg), cfg.eval.every, cfg.checkpoint, cfg.progress,
                   (cfg.reward.max_failure_rate, cfg.reward.failure_steps))


@dataclass
class Handles:
    run: GRPORun
    dataset: Service
    generator: Service
    samplers: Samplers  # generator + reward workers, or generator + environment workers (multi-turn)
    trainer: Service
    buffer: Service
    ref_model: Service | None
    pad_id: int
    warm_start: dict[str, float]  # metrics of the warm start run by this experiment ({} when cached or none)
    timeline: Timeline | None = None  # every service call (runtime/timeline.py): each step's timeline/ metrics


async def build(cfg, runtime: Runtime, resume: ResumeState | None = None) -> Handles:
    """The run's services, from the config read once here: the loop's view (GRPORun), how episodes are sampled
    and scored (RolloutPlan: single- or multi-turn), the trainer's arguments, the warm start, the reference model."""
    run, plan, warm_start = GRPORun.of(cfg), RolloutPlan.of(cfg), WarmStart.of(cfg)
    reference = ReferencePlan.of(cfg, warm_start, resume is not None)  # the KL term's: the run's first policy
    dataset = runtime.spawn("dataset", DatasetService, cfg.dataset, cfg.model)
    init_path, cached, warm = None, False, {}
    if resume:  # weights, optimizer and version from the checkpoint
        init_path, cached = str(resume.path), True
    elif warm_start:  # cached: the first run trains and saves it, later runs load it
        init_path, cached = str(warm_start.dir), warm_start.cached
    trainer = await spawn_trainer(runtime, TrainerPlan.of(cfg), init_path if cached else None,
                                  resume.step if resume else 0)
    # The generator starts with the trainer when its weights exist already, so the two processes build at once;
    # a warm start still to be trained gives it its weights first.
    generator = plan.spawn_generator(runtime, init_path) if cached or not init_path else None
    scorer = plan.spawn_scorer(runtime)  # reward workers, or environment workers for a multi-turn env
    if warm_start and not cached:
        warm = await warm_start.train(trainer, dataset, scorer)
    elif warm_start and not resume:  # cached: RL then reads the prompts after the warm start's, as it does after a
        await warm_start.skip(dataset)  # fresh one: a cache hit changes nothing downstream
    generator = generator or plan.spawn_generator(runtime, init_path)
    buffer = runtime.spawn("replay_buffer", ReplayBufferService, cfg.algorithm.max_policy_age, cfg.seed)
    ref_model = await reference.start(runtime, trainer) if reference else None
    await trainer.route().push_weights.call_one(generator.fanout())  # generators start at the trainer's version
    pad_id = await generator.route().pad_id.call_one()
    h = Handles(run, dataset, generator, plan.samplers(generator, scorer), trainer, buffer, ref_model, pad_id, warm,
                runtime.timeline)
    if resume and resume.loop:  # the prompt stream and the replay buffer as the interrupted run left them
        await restore(dataset, buffer, resume.loop)
    return h


async def rollouts(h: Handles, overlap: Overlap) -> None:
    """Fill the replay buffer. Each batch is made in a task of its own, begun as soon as it is within
    max_policy_age versions of the generators' weights (with algorithm.rollout_waves: in waves of max_policy_age + 1,
    each once every batch before it has trained), so up to max_policy_age + 1 batches generate at once (the
    generator decodes their rows together); they reach the buffer in order."""
    async for b in overlap.rollout_batches():
        overlap.run_batch(rollout_batch(h, overlap, b))


async def rollout_batch(h: Handles, overlap: Overlap, b: int) -> None:
    """Batch b: its draws are seeded by (run seed, b, attempt)."""
    a, max_len = h.run.algorithm, h.samplers.response_budget
    # Dynamic sampling (DAPO): drop groups whose rewards are all equal, refill up to max_sampling_attempts.
    sampler = DynamicSampling(a.prompts_per_step, a.max_sampling_attempts, enabled=a.dynamic_sampling)
    seen: list[Group] = []
    generated = {"generator/seconds": 0.0, "generator/tokens": 0.0}
    while not sampler.done:
        problems = await h.dataset.route().sample.call_one(sampler.needed)
        groups, gen_metrics = await sample_groups(h.samplers, problems, a.group_size, a.temperature, a.top_p,
                                                  seed=rollout_seed(h.run.seed, b, sampler.attempts))
        sampler.add(groups)
        seen += groups
        generated = {k: generated.get(k, 0.0) + v for k, v in gen_metrics.items()}  # over every attempt
    groups = sampler.take() + sampler.top_up(seen)
    if a.overlong_penalty:  # reward shaping: DAPO's soft overlong punishment
        groups = penalize_overlong(groups, max_len, a.overlong_buffer_len(max_len))
    episodes = to_episodes(groups, group_advantages(groups, a.advantage, a.advantage_eps))
    if h.ref_model is not None:  # the KL term: a service of its own, or the trainer (ReferencePlan)
        ref = await h.ref_model.route().logprobs.call_one(collate_episodes(episodes, h.pad_id))
        for e, row in zip(episodes, ref):
            e.ref_logprobs = row[: len(e.completion.token_ids)].tolist()
    await overlap.turn(b)  # after batch b - 1
    await h.buffer.route().add.call_one(episodes)
    generated["generator/tokens_per_s"] = generated["generator/tokens"] / max(generated["generator/seconds"], 1e-9)
    metrics = {**generated, **h.samplers.metrics(seen), **sampler.metrics(),
               "rollout/policy_age": overlap.published - min(g.policy_version for g in seen)}
    overlap.added(len(episodes), metrics, h.samplers.rows(seen))  # what samples/completions.json shows


async def train(h: Handles, tracker: Tracker, resume: ResumeState | None = None) -> dict[str, float]:
    run, a = h.run, h.run.algorithm
    steps = Steps("grpo", run.steps, tracker, h.trainer, run.checkpoint, run.eval_every, run.progress, resume)
    heldout = await h.dataset.route().eval_problems.call_one()
    start = await steps.opening(lambda: evaluate(h.samplers, heldout, 0, run.eval),
                                "eval/accuracy" if heldout else None)
    tracker.begin()  # every process is up: the MLflow run is created while the first steps run
    overlap = Overlap(steps, h.buffer, h.dataset, a.prompts_per_step * a.group_size, a.max_policy_age,
                      RewardWatch(*run.reward_failures), lambda: h.samplers.reward.route().errors.call_one(),
                      h.timeline, waves=a.rollout_waves)
    async with overlap.running(rollouts(h, overlap)):
        async for step, episodes in overlap.training_batches():  # the next one is taken while this one trains
            batch = collate_episodes(episodes, h.pad_id)
            metrics = await h.trainer.route().train_step.call_one(batch)                         # version step
            metrics.update(await h.trainer.route().push_weights.call_one(h.generator.fanout()))  # to generators
            overlap.publish(step, metrics, batch.policy_versions)                                # rollouts go on
            if steps.eval_due(step):
                metrics.update(await evaluate(h.samplers, heldout, step, run.eval))
            await overlap.end_step(step, metrics)  # log, checkpoint, reward watch, stall warning, progress
    end = await evaluate(h.samplers, heldout, run.steps, run.eval)
    tracker.log_metrics(end, step=run.steps)
    if (bad := (await h.dataset.route().state.call_one())["bad_rows"]) is not None:  # dataset.bad_rows=skip's count
        tracker.log_metrics({"data/bad_rows": float(bad)}, step=run.steps)
    if overlap.samples:
        tracker.log_table({k: [row[k] for row in overlap.samples] for k in overlap.samples[0]},
                          "samples/completions.json")
    if h.timeline is not None:  # every service call of the run: open it in Perfetto or chrome://tracing
        tracker.log_text(json.dumps(h.timeline.chrome_trace()), "timeline.json")
    return {f"{k}_{when}": v for when, m in (("start", start), ("end", end)) for k, v in m.items()
            if k.endswith("/accuracy")}  # overall, and each task's of a mix
