"""Rollouts and training at once (apps/grpo.py): the operational half of an asynchronous RL loop.

    rollouts  `async for batch in overlap.rollout_batches()`: a batch starts only while it is within
              max_policy_age versions of the weights the generators hold (with `waves`, only with the other
              batches of its wave, once every batch before them has trained), and never during a checkpoint;
              `overlap.run_batch(coroutine)` makes it in a task of its own, so up to max_policy_age + 1 batches
              are made at once; each `await overlap.turn(batch)` before the replay buffer (batches land in
              order) and `overlap.added(...)` once its episodes are in it
    training  `async with overlap.running(rollouts)` runs them beside the steps;
              `async for step, episodes in overlap.training_batches()` takes each step's batch from the buffer (the
              next one while this step trains), and ends at a stop signal with a checkpoint of what is done;
              `overlap.publish(step, ...)` once the generators hold version `step`; `overlap.end_step(...)` logs,
              checkpoints (with no rollout batch in flight), watches the rewards and warns of a stall

A batch made now is trained at version `batches made so far`: its draws are seeded by (run seed, batch, call)
(driver/checkpoint.py: rollout_seed), so with max_policy_age=0 a resumed run is the uninterrupted one bit for bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any, Awaitable, Callable, Coroutine

from forge_exp.driver.checkpoint import step_dir
from forge_exp.driver.faults import STOP, RewardWatch, Stopped
from forge_exp.driver.steps import Steps
from forge_exp.runtime.services import Service
from forge_exp.runtime.timeline import Timeline

log = logging.getLogger(__name__)
STALL_STEPS = 10  # steps in a row with no group of mixed rewards before the run says it is learning nothing
STOP_POLL_S = 0.05  # how often a training side waiting for a batch looks at the stop signal


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


class Quiesce:
    """A moment with no rollout batch in flight, for a snapshot of the buffer and the prompt stream that agrees
    with itself. Rollouts call `begin()` before a batch and `end()` after it has reached the buffer (batches may
    be made several at once)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0

    async def begin(self) -> None:
        await self._open.wait()
        self._in_flight += 1
        self._idle.clear()

    def end(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def paused(self, *rollout_tasks: asyncio.Task | None):
        self._open.clear()
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            tasks = [t for t in rollout_tasks if t is not None]
            while not idle.done():
                for t in tasks:
                    if t.done() and (t.cancelled() or t.exception() is not None):
                        t.result()  # the rollouts failed: raise that
                running = [t for t in tasks if not t.done()]
                if not running:  # the rollouts are over: nothing more will land
                    break
                await asyncio.wait([idle, *running], return_when=asyncio.FIRST_COMPLETED)
            yield
        finally:
            idle.cancel()
            self._open.set()


class Overlap:
    """Batches of `batch_episodes` episodes go from the rollouts to the training steps of `steps` through `buffer`.
    `published` is the newest weight version every generator has; `timeline` (runtime/timeline.py) gives each step
    where its wall time went. `reward_errors` returns the reward workers' last
    errors, for the message of a reward that keeps failing. Its checkpoints hold loop.json (`snapshot`)."""

    def __init__(self, steps: Steps, buffer: Service, dataset: Service, batch_episodes: int, max_policy_age: int,
                 watch: RewardWatch, reward_errors: Callable[[], Awaitable[dict]], timeline: Timeline | None = None,
                 waves: bool = False):
        self.steps, self.buffer, self.dataset = steps, buffer, dataset
        self.timeline = timeline  # the run's service calls: each step's timeline/ metrics
        self.n, self.max_age, self.waves = batch_episodes, max_policy_age, waves
        self.watch, self.reward_errors = watch, reward_errors
        steps.snapshot = self.snapshot
        self.published = steps.first - 1
        self.episodes_added = (steps.first - 1) * batch_episodes
        self.changed = Changed()  # notified on every change of published / episodes_added
        self.done = False
        self.rollout_metrics: deque[dict[str, float]] = deque()  # one entry per batch, oldest first
        self.samples: list[dict[str, Any]] = []
        self.quiesce = Quiesce()  # a checkpoint's moment with no batch in flight
        loop = steps.resume.loop if steps.resume else None
        if loop:  # the batches the interrupted run had made, and their rollout metrics
            self.episodes_added = loop["episodes_added"]
            self.rollout_metrics.extend(loop["rollout_metrics"])
            self.samples = loop["samples"]
        self.landed = self.episodes_added // batch_episodes  # batches in the buffer
        self.started = self.landed  # batches begun (in the buffer, or still being made)
        self.batches: set[asyncio.Task] = set()  # the batches being made (`run_batch`)
        self.failure: BaseException | None = None  # the first batch that failed
        self.task: asyncio.Task | None = None  # the rollouts
        self.taking: asyncio.Task | None = None  # the next step's batch, taken while this step trains
        self.t0 = self.wait = 0.0
        self.stalled = 0  # steps in a row on which every group's rewards were all equal (zero advantage)

    # --- the rollouts' side
    async def rollout_batches(self):
        """The index of each batch to make, once the policy-age bound allows it. A batch is in flight until
        `added`: the next one may begin before (`run_batch`)."""
        while not self.done:
            self.raise_failure()
            if self.published < self.first_version(self.started):
                await self.changed.wait()  # for the next version (or a batch's failure)
                continue
            await self.quiesce.begin()
            self.started += 1
            yield self.started - 1

    def first_version(self, batch: int) -> int:
        """The oldest weight version the generators may hold when `batch` begins (it is trained at version `batch`).
        Waves of max_policy_age + 1 batches begin together at the version that trained every batch before them:
        their samples are 0, 1, ... max_policy_age versions old, and on one GPU their generation and the training
        steps take turns instead of sharing the SMs."""
        return batch - batch % (self.max_age + 1) if self.waves else batch - self.max_age

    def run_batch(self, batch: Coroutine) -> None:
        """Make a batch in a task of its own (`batch`: its generation, scoring, `turn` and `added`), so the next
        batch may begin while it runs; a failure fails the rollouts and the training side."""
        task = asyncio.ensure_future(batch)
        self.batches.add(task)

        def ended(task: asyncio.Task) -> None:
            self.batches.discard(task)
            if not task.cancelled() and task.exception() is not None and self.failure is None:
                self.failure = task.exception()
            self.changed.notify()  # a failure wakes the waiting sides

        task.add_done_callback(ended)

    async def turn(self, batch: int) -> None:
        """Once every batch before `batch` is in the buffer: batches reach it in order."""
        while self.landed < batch:
            await self.changed.wait()

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def added(self, episodes: int, metrics: dict[str, float], samples: list[dict]) -> None:
        """A batch's episodes are in the buffer: its rollout metrics and sample rows."""
        self.episodes_added += episodes
        self.landed += 1
        self.quiesce.end()
        self.changed.notify()
        self.rollout_metrics.append(metrics)
        self.samples += samples

    # --- the training side
    @contextlib.asynccontextmanager
    async def running(self, rollouts: Coroutine):
        self.task = asyncio.create_task(rollouts)
        self.task.add_done_callback(lambda _: self.changed.notify())  # a failure wakes the training side
        STOP.steps_started = True  # from here a stop signal ends the run at a step boundary, with a checkpoint
        try:
            yield self
        finally:
            self.done = True
            self.changed.notify()
            if self.taking is not None:
                self.taking.cancel()
                await asyncio.gather(self.taking, return_exceptions=True)
            self.steps.close()
            rollouts = [self.task, *self.batches]
            for t in rollouts:  # a batch in flight is not waited for (a stop, a failure, or the last step)
                t.cancel()
            await asyncio.gather(*rollouts, return_exceptions=True)

    async def training_batches(self):
        """(step, its episodes) for every step; a stop signal between steps checkpoints what is done and raises
        Stopped."""
        for step in self.steps:
            self.t0 = time.perf_counter()
            episodes = None
            if self.taking is not None:  # taken while the step before trained
                episodes = await self.taking
            elif not STOP.requested:
                episodes = await self.take(step)
            if STOP.requested:
                if episodes is not None:  # taken early for this step: back into the buffer for the checkpoint
                    await self.buffer.route().unsample.call_one()
                raise await self.stop(step - 1)
            self.taking = None
            self.wait = time.perf_counter() - self.t0
            if step < self.steps.total and not self.steps.checkpoint_due(step):
                # the next batch is sampled and waited for while this step trains (at version `step`, as it would
                # be after it: the same episodes); not before a checkpoint, whose snapshot of the buffer must hold it
                self.taking = asyncio.create_task(self.take(step + 1))
            yield step, episodes

    async def take(self, step: int) -> list | None:
        """The episodes step `step` trains on, once there; None: a stop signal."""
        while not STOP.requested:
            if self.episodes_added >= step * self.n:  # its batch is made (the buffer may still have evicted some)
                episodes = await self.buffer.route().sample.call_one(self.n, step - 1)
                if episodes is not None:
                    return episodes
            self.raise_failure()  # a batch's failure
            if self.task.done():
                self.task.result()  # re-raise the rollout failure
            await self.changed.wait(timeout=STOP_POLL_S)  # for the next batch (and a look at the stop signal)
        return None

    def publish(self, step: int, metrics: dict[str, float], policy_versions) -> None:
        """Every generator holds version `step`: rollouts may go on. Adds the metrics of the rollout that made the
        step's batch, how long the step took and waited, and how old its samples were."""
        self.published = step
        self.changed.notify()
        if self.rollout_metrics:  # batches leave the buffer in order
            metrics.update(self.rollout_metrics.popleft())
        now = time.perf_counter()
        if self.timeline is not None:  # from taking the batch to the generators holding the new version
            metrics.update(self.timeline.breakdown(self.t0, now))
        metrics.update({
            "time/step_seconds": now - self.t0,
            "time/wait_seconds": self.wait,
            "train/policy_age": float((step - 1 - policy_versions).float().mean()),
        })

    async def end_step(self, step: int, metrics: dict[str, float]) -> None:
        await self.steps.logged(step, metrics)
        if failing := self.watch.update(metrics):  # a reward that keeps raising: nothing is being learned
            raise self.watch.error(*failing, (await self.reward_errors()).get(failing[0]))
        self.stalled = self.stalled + 1 if metrics.get("filter/zero_variance_frac") == 1.0 else 0
        if self.stalled == STALL_STEPS:  # once per stall
            msg = (f"every group has had zero reward variance for {STALL_STEPS} steps (reward/mean "
                   f"{metrics.get('reward/mean', float('nan')):.3f}): advantages are 0 and the policy does not "
                   f"move; check the reward functions, the task's difficulty, and algorithm.temperature")
            log.warning(msg)
            self.steps.bar.write(f"forge-exp: warning: {msg}")
        self.steps.advance(
            reward=f"{metrics.get('reward/mean', float('nan')):.2f}",
            acc=f"{metrics.get('rollout/accuracy', float('nan')):.2f}",
            tok_s=f"{metrics.get('generator/tokens_per_s', 0):.0f}",
            **({"stalled": self.stalled} if self.stalled >= STALL_STEPS else {}),
        )

    # --- checkpoints and stops
    async def snapshot(self) -> dict:
        """loop.json: what the loop has that the weights do not say, at a moment with no rollout batch in flight."""
        async with self.quiesce.paused(self.task, *self.batches):
            return {
                "dataset": await self.dataset.route().state.call_one(),
                "buffer": await self.buffer.route().state.call_one(),
                "episodes_added": self.episodes_added,
                "rollout_metrics": list(self.rollout_metrics),
                "samples": list(self.samples),
            }

    async def stop(self, step: int) -> Stopped:
        """SIGTERM / SIGUSR2 / Ctrl-C, between steps: checkpoint what is done."""
        every = self.steps.ckpt.every
        if every and step > self.steps.saved:
            await self.steps.checkpoint(step)
        done = every and step > 0 and step == self.steps.saved
        return Stopped(STOP.requested, step, str(step_dir(self.steps.ckpt.dir, step)) if done else None,
                       "checkpoint.every=0" if not every else "no step had finished")


async def restore(dataset: Service, buffer: Service, loop: dict) -> None:
    """The prompt stream and the replay buffer as a checkpoint's loop.json left them."""
    await dataset.route().restore.call_one(loop["dataset"])
    await buffer.route().restore.call_one(loop["buffer"])
