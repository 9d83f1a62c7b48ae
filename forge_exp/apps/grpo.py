"""GRPO, asynchronous: rollouts and training overlap, off-policy by at most `algorithm.max_policy_age` versions.

    loop over steps:
        rollouts (concurrently):  prompts → generator (group_size each) → reward workers → advantages, filters
                                  → [reference logprobs] → replay buffer
                                  (a multi-turn env: prompts → environment workers, each turn through the
                                  generator, the episodes scored by the environment: apps/rollout.py)
        training:                 replay buffer → trainer.train_step → weights v+1 → every generator replica

The app talks to services through handles (runtime/services.py) and never imports monarch. Building the services
is `build()`; the algorithm itself is `train()` and `rollouts()` below.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from forge_exp.actors.dataset import DatasetService
from forge_exp.actors.generator import Generator
from forge_exp.actors.reference import ReferenceModel
from forge_exp.actors.replay_buffer import ReplayBufferService
from forge_exp.apps.checkpoint import (Quiesce, ResumeState, loop_snapshot, restore_services, rollout_seed,
                                       save_checkpoint, step_dir)
from forge_exp.apps.common import (
    evaluate, generator_sizes, response_budget, skip_warm_start, spawn_scorers, spawn_trainer, wants_warm_start,
    warm_start, warm_start_dir,
)
from forge_exp.apps.faults import STOP, RewardWatch, Stopped
from forge_exp.apps.rollout import Samplers, rollout_metrics, sample_groups
from forge_exp.data.collate import collate_episodes
from forge_exp.envs.report import conversation_rows
from forge_exp.rl.episodes import to_episodes
from forge_exp.rl.filters import DynamicSampling
from forge_exp.rl.types import Group
from forge_exp.runtime.services import Runtime, Service
from forge_exp.tracking.mlflow import Tracker

log = logging.getLogger(__name__)
STALL_STEPS = 10  # steps in a row with no group of mixed rewards before the run says it is learning nothing
STOP_POLL_S = 0.05  # how often a training side waiting for a batch looks at the stop signal


@dataclass
class Handles:
    dataset: Service
    generator: Service
    samplers: Samplers  # generator + reward workers, or generator + environment workers (multi-turn)
    trainer: Service
    buffer: Service
    ref_model: Service | None
    pad_id: int
    warm_start: dict[str, float]  # metrics of the warm start run by this experiment ({} when cached or none)


class Changed:
    """Wakes whoever waits when rollouts and training have news for each other (a version published, a batch in the
    buffer, the end), instead of either polling."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()  # later waiters wait for the next change

    async def wait(self, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass


@dataclass
class LoopState:
    """What rollouts and training share. `published` is the newest weight version every generator has."""

    published: int = 0
    episodes_added: int = 0
    changed: Changed = field(default_factory=Changed)  # notified on every change of published / episodes_added
    done: bool = False
    rollout_metrics: deque[dict[str, float]] = field(default_factory=deque)  # one entry per batch, oldest first
    samples: list[dict[str, Any]] = field(default_factory=list)
    quiesce: Quiesce = field(default_factory=Quiesce)  # a checkpoint's moment with no batch in flight


async def build(cfg, runtime: Runtime, resume: ResumeState | None = None) -> Handles:
    dataset = runtime.spawn("dataset", DatasetService, cfg.dataset, cfg.model)
    init_path, cached, warm = None, False, {}
    if resume:  # weights, optimizer and version from the checkpoint
        init_path, cached = str(resume.path), True
    elif wants_warm_start(cfg):  # cached: the first run trains and saves it, later runs load it
        init_path = str(warm_start_dir(cfg))
        cached = (warm_start_dir(cfg) / "config.json").exists()
    trainer = await spawn_trainer(cfg, runtime, init_path if cached else None, resume.step if resume else 0)

    def spawn_generator() -> Service:
        return runtime.spawn("generator", Generator, cfg.generator, cfg.model, init_path, cfg.seed,
                             generator_sizes(cfg))

    # The generator starts with the trainer when its weights exist already, so the two processes build at once;
    # a warm start still to be trained gives it its weights first.
    generator = spawn_generator() if cached or not init_path else None
    scorers = spawn_scorers(cfg, runtime)  # reward workers, or environment workers for a multi-turn env
    if init_path and not cached:
        warm = await warm_start(cfg, trainer, dataset, scorers.get("env"))
    elif cached and not resume and wants_warm_start(cfg):  # RL then reads the prompts after the warm start's,
        await skip_warm_start(cfg, dataset)  # as it does after a fresh one: a cache hit changes nothing downstream
    generator = generator or spawn_generator()
    s = Samplers(generator, **scorers, in_flight=cfg.services.generator.in_flight)
    buffer = runtime.spawn("replay_buffer", ReplayBufferService, cfg.algorithm.max_policy_age, cfg.seed)
    ref_model = None
    if cfg.algorithm.beta > 0:  # with LoRA, the trainer's base with its adapters off (its `logprobs` endpoint)
        ref_model = trainer if cfg.model.lora.rank is not None else runtime.spawn(
            "ref_model", ReferenceModel, cfg.model, init_path, cfg.algorithm.temperature)
    await trainer.route().push_weights.call_one(generator.fanout())  # generators start at the trainer's version
    pad_id = await generator.route().pad_id.call_one()
    h = Handles(dataset, generator, s, trainer, buffer, ref_model, pad_id, warm)
    if resume and resume.loop:  # the prompt stream and the replay buffer as the interrupted run left them
        await restore_services(h, resume.loop)
    return h


async def rollouts(cfg, h: Handles, state: LoopState) -> None:
    """Fill the replay buffer. A batch made now is trained at version `batches made so far`; it may start only
    while that is within max_policy_age of the weights the generators hold."""
    a = cfg.algorithm
    batch_episodes = a.prompts_per_step * a.group_size
    while not state.done:
        if state.episodes_added // batch_episodes - state.published > a.max_policy_age:
            await state.changed.wait()  # for the next version
            continue
        await state.quiesce.begin()
        batch = state.episodes_added // batch_episodes  # its draws are seeded by (run seed, batch, call)
        # Dynamic sampling (DAPO): drop groups whose rewards are all equal, refill up to max_sampling_attempts.
        sampler = DynamicSampling(a.prompts_per_step, a.max_sampling_attempts, enabled=a.dynamic_sampling)
        seen: list[Group] = []
        generated = {"generator/seconds": 0.0, "generator/tokens": 0.0}
        while not sampler.done:
            problems = await h.dataset.route().sample.call_one(sampler.needed)
            groups, gen_metrics = await sample_groups(cfg, h.samplers, problems, a.group_size, a.temperature,
                                                      a.top_p, seed=rollout_seed(cfg.seed, batch, sampler.attempts))
            generated = {k: generated.get(k, 0.0) + v for k, v in gen_metrics.items()}  # over every attempt
            sampler.add(groups)
            seen += groups
        groups = sampler.take()
        if sampler.exhausted:  # rather than stall: top up with the dropped groups (zero advantage)
            kept = {id(g) for g in groups}
            groups += [g for g in seen if id(g) not in kept][: sampler.needed]
        max_len = response_budget(cfg)
        episodes = to_episodes(groups, a.advantage, a.advantage_eps, a.overlong_penalty, max_len,
                               a.overlong_buffer_len(max_len))
        if h.ref_model is not None:
            ref = await h.ref_model.route().logprobs.call_one(collate_episodes(episodes, h.pad_id))
            for e, row in zip(episodes, ref):
                e.ref_logprobs = row[: len(e.completion.token_ids)].tolist()
        await h.buffer.route().add.call_one(episodes)
        state.episodes_added += len(episodes)
        state.changed.notify()
        generated["generator/tokens_per_s"] = generated["generator/tokens"] / max(generated["generator/seconds"], 1e-9)
        state.rollout_metrics.append(
            {
                **generated,
                **rollout_metrics(seen, multi_turn=h.samplers.env is not None),
                **sampler.metrics(),
                "rollout/policy_age": state.published - min(g.policy_version for g in seen),
            }
        )
        if h.samplers.env is not None:  # whole conversations, with roles
            state.samples += conversation_rows(seen, k=2)
        else:
            g = seen[0]
            state.samples.append(
                {"version": g.policy_version, "prompt": g.problem.prompt, "completion": g.completions[0].text,
                 "target": g.problem.target, "reward": g.rewards[0]}
            )
        state.quiesce.end()


async def train(cfg, h: Handles, tracker: Tracker, resume: ResumeState | None = None) -> dict[str, float]:
    a = cfg.algorithm
    heldout = await h.dataset.route().eval_problems.call_one()
    first = resume.step + 1 if resume else 1
    if resume:
        start = {"eval/accuracy": tracker.metric_at("eval/accuracy", step=0)} if heldout else {}
    else:
        start = await evaluate(cfg, h.samplers, heldout, step=0)
        tracker.log_metrics(start, step=0)
    tracker.begin()  # every process is up: the MLflow run is created while the first steps run
    state = LoopState(published=first - 1, episodes_added=(first - 1) * a.prompts_per_step * a.group_size)
    if resume and resume.loop:  # the batches the interrupted run had made, and their rollout metrics
        state.episodes_added = resume.loop["episodes_added"]
        state.rollout_metrics.extend(resume.loop["rollout_metrics"])
        state.samples = resume.loop["samples"]
    rollout_task = asyncio.create_task(rollouts(cfg, h, state))
    rollout_task.add_done_callback(lambda _: state.changed.notify())  # a failure wakes the training side
    bar = tqdm(total=cfg.steps, initial=first - 1, desc="grpo", disable=not cfg.progress, dynamic_ncols=True)
    stalled = 0  # steps in a row on which every group's rewards were all equal (zero advantage: no gradient)
    rewards_ok = RewardWatch(cfg.reward.max_failure_rate, cfg.reward.failure_steps)
    saved = first - 1 if resume else 0

    async def checkpoint(step: int) -> None:  # a consistent cut: no rollout batch in flight while it is taken
        nonlocal saved
        async with state.quiesce.paused(rollout_task):
            loop = await loop_snapshot(h, state)
        await save_checkpoint(cfg, h.trainer, tracker, step, loop)
        saved = step

    async def stop(step: int) -> Stopped:  # SIGTERM / SIGUSR2 / Ctrl-C, between steps: keep what is done
        if cfg.checkpoint.every and step > saved:
            await checkpoint(step)
        done = cfg.checkpoint.every and step > 0 and step == saved
        return Stopped(STOP.requested, step, str(step_dir(cfg.checkpoint.dir, step)) if done else None,
                       "checkpoint.every=0" if not cfg.checkpoint.every else "no step had finished")

    async def take(step: int) -> list | None:  # the episodes step `step` trains on, once there; None: a stop signal
        n = a.prompts_per_step * a.group_size
        while not STOP.requested:
            if state.episodes_added >= step * n:  # its batch has been made (the buffer may still have evicted some)
                episodes = await h.buffer.route().sample.call_one(n, step - 1)
                if episodes is not None:
                    return episodes
            if rollout_task.done():
                rollout_task.result()  # re-raise the rollout failure
            await state.changed.wait(timeout=STOP_POLL_S)  # for the next batch (and a look at the stop signal)
        return None

    taking: asyncio.Task | None = None  # the next step's batch, taken while this step trains
    STOP.steps_started = True  # from here a stop signal ends the run at a step boundary, with a checkpoint
    try:
        for step in range(first, cfg.steps + 1):
            t0 = time.perf_counter()
            episodes = None
            if taking is not None:  # taken while the step before trained
                episodes = await taking
            elif not STOP.requested:
                episodes = await take(step)
            if STOP.requested:  # a stop signal, between steps: checkpoint what is done and end
                if episodes is not None:  # taken early for this step: back into the buffer for the checkpoint
                    await h.buffer.route().unsample.call_one()
                raise await stop(step - 1)
            taking = None
            wait = time.perf_counter() - t0
            batch = collate_episodes(episodes, h.pad_id)
            # trains version step-1 → step and pushes it to every generator, in one call
            training = asyncio.ensure_future(h.trainer.route().train_step.call_one(batch, h.generator.fanout()))
            if step < cfg.steps and not (cfg.checkpoint.every and step % cfg.checkpoint.every == 0):
                # the next batch is sampled and waited for meanwhile (at version `step`, as it would be after this
                # step: the same episodes); not before a checkpoint, whose snapshot of the buffer must hold it
                taking = asyncio.create_task(take(step + 1))
            metrics = await training
            state.published = step
            state.changed.notify()
            if state.rollout_metrics:  # the rollout that made this batch (batches leave the buffer in order)
                metrics.update(state.rollout_metrics.popleft())
            metrics.update(
                {
                    "time/step_seconds": time.perf_counter() - t0,
                    "time/wait_seconds": wait,
                    "train/policy_age": float((step - 1 - batch.policy_versions).float().mean()),
                }
            )
            if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
                metrics.update(await evaluate(cfg, h.samplers, heldout, step=step))
            tracker.log_metrics(metrics, step=step)
            if step % 10 == 0:
                tracker.flush()
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                await checkpoint(step)
            if failing := rewards_ok.update(metrics):  # a reward that keeps raising: nothing is being learned
                errors = await h.samplers.reward.route().errors.call_one()
                raise rewards_ok.error(*failing, errors.get(failing[0]))
            stalled = stalled + 1 if metrics.get("filter/zero_variance_frac") == 1.0 else 0
            if stalled == STALL_STEPS:  # once per stall
                msg = (f"every group has had zero reward variance for {STALL_STEPS} steps (reward/mean "
                       f"{metrics.get('reward/mean', float('nan')):.3f}): advantages are 0 and the policy does not "
                       f"move; check the reward functions, the task's difficulty, and algorithm.temperature")
                log.warning(msg)
                bar.write(f"forge-exp: warning: {msg}")
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics.get('reward/mean', float('nan')):.2f}",
                acc=f"{metrics.get('rollout/accuracy', float('nan')):.2f}",
                tok_s=f"{metrics.get('generator/tokens_per_s', 0):.0f}",
                **({"stalled": stalled} if stalled >= STALL_STEPS else {}),
            )
    finally:
        state.done = True
        state.changed.notify()
        if taking is not None:
            taking.cancel()
            await asyncio.gather(taking, return_exceptions=True)
        bar.close()
        rollout_task.cancel()  # a batch in flight is not waited for (a stop, a failure, or the last step)
        await asyncio.gather(rollout_task, return_exceptions=True)
    end = await evaluate(cfg, h.samplers, heldout, step=cfg.steps)
    tracker.log_metrics(end, step=cfg.steps)
    if (bad := (await h.dataset.route().state.call_one())["bad_rows"]) is not None:  # dataset.bad_rows=skip's count
        tracker.log_metrics({"data/bad_rows": float(bad)}, step=cfg.steps)
    if state.samples:
        tracker.log_table({k: [row[k] for row in state.samples] for k in state.samples[0]}, "samples/completions.json")
    return {f"{k}_{when}": v for when, m in (("start", start), ("end", end)) for k, v in m.items()
            if k.endswith("/accuracy")}  # overall, and each task's of a mix

