"""The driver around the steps, without processes: which steps a resumed run takes, the cadences, the policy-age
gate between rollouts and training, and a stop signal between steps. The same with real services and signals:
tests/faults/test_stop_signals.py, tests/faults/test_resume_exact.py."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from forge_exp.driver.checkpoint import ResumeState, step_dir
from forge_exp.driver.faults import STOP, RewardWatch, Stopped
from forge_exp.driver.overlap import Overlap
from forge_exp.driver.steps import Steps


@pytest.fixture(autouse=True)
def no_stop_left():
    yield
    STOP.signum, STOP.steps_started = None, False


class FakeTracker:
    run_id, uri = "run", None

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []
        self.flushes = 0

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def flush(self):
        self.flushes += 1

    def metric_at(self, key, step):
        return {("eval/accuracy", 0): 0.25}[(key, step)]

    def take_pending(self):
        return []

    def send(self, pending):
        return True


class Endpoints:
    """A service's route(): each endpoint's call_one runs the given function."""

    def __init__(self, **calls):
        self.calls = calls

    def route(self):
        return SimpleNamespace(**{name: SimpleNamespace(call_one=self._call(fn)) for name, fn in self.calls.items()})

    @staticmethod
    def _call(fn):
        async def call_one(*args):
            return fn(*args)
        return call_one


def saving_trainer(saved: list[str]) -> Endpoints:
    def save(path, metadata):
        Path(path).mkdir(parents=True)
        saved.append(Path(path).name)
    return Endpoints(save=save)


def steps(tmp_path, total=5, every=0, resume=None, tracker=None, saved=None) -> Steps:
    ckpt = SimpleNamespace(dir=str(tmp_path), every=every, keep=0)
    return Steps("test", total, tracker or FakeTracker(), saving_trainer(saved if saved is not None else []), ckpt,
                 eval_every=2, progress=False, resume=resume)


def test_a_resumed_loop_runs_the_steps_after_its_checkpoint_and_reads_its_opening_evaluation(tmp_path):
    tracker = FakeTracker()
    resumed = steps(tmp_path, resume=ResumeState(step=3, run_id="run", path=tmp_path), tracker=tracker)
    assert list(resumed) == [4, 5] and resumed.saved == 3

    async def never():
        raise AssertionError("a resumed run does not evaluate step 0 again")

    assert asyncio.run(resumed.opening(never, "eval/accuracy")) == {"eval/accuracy": 0.25}
    assert tracker.logged == []
    fresh = steps(tmp_path, tracker=tracker)

    async def evaluate():
        return {"eval/accuracy": 0.5}

    assert list(fresh) == [1, 2, 3, 4, 5] and asyncio.run(fresh.opening(evaluate, "eval/accuracy"))
    assert tracker.logged == [(0, {"eval/accuracy": 0.5})]
    assert [s for s in fresh if fresh.eval_due(s)] == [2, 4]  # not the last step: the closing evaluation is that one


def test_steps_are_logged_flushed_and_checkpointed_on_their_cadence(tmp_path):
    tracker, saved = FakeTracker(), []
    s = steps(tmp_path, total=20, every=4, tracker=tracker, saved=saved)

    async def run():
        for step in s:
            await s.logged(step, {"x": float(step)})

    asyncio.run(run())
    assert [step for step, _ in tracker.logged] == list(range(1, 21)) and tracker.flushes == 2
    assert saved == [step_dir(tmp_path, n).name for n in (4, 8, 12, 16, 20)] and s.saved == 20


def overlap(tmp_path, max_policy_age: int, every=0, saved=None, waves=False) -> Overlap:
    buffer: list = []
    endpoints = Endpoints(add=buffer.extend, sample=lambda n, version: buffer[:n] if len(buffer) >= n else None,
                          unsample=lambda: 0, state=lambda: {"held": len(buffer)})
    return Overlap(steps(tmp_path, total=3, every=every, saved=saved), endpoints, Endpoints(state=lambda: {}),
                   batch_episodes=2, max_policy_age=max_policy_age, watch=RewardWatch(1.0, 1),
                   reward_errors=lambda: {}, waves=waves)


def train_on(o: Overlap, rollouts) -> list:
    async def train():
        trained = []
        async with o.running(rollouts):
            async for step, episodes in o.training_batches():
                trained.append((step, episodes))
                metrics: dict = {}
                o.publish(step, metrics, torch.tensor([step - 1]))
                await o.end_step(step, metrics)
        return trained

    return asyncio.run(train())


@pytest.mark.parametrize("max_policy_age", [0, 1])
def test_a_batch_starts_only_within_max_policy_age_of_the_published_weights(tmp_path, max_policy_age):
    o = overlap(tmp_path, max_policy_age)
    started: list[tuple[int, int]] = []  # (batch, the version published when it started)

    async def rollouts():  # one batch at a time, made inline
        async for b in o.rollout_batches():
            started.append((b, o.published))
            await o.buffer.route().add.call_one([b, b])
            o.added(2, {"rollout/batch": float(b)}, [])

    assert [step for step, _ in train_on(o, rollouts())] == [1, 2, 3]
    assert all(b - version <= max_policy_age for b, version in started)
    assert [b for b, _ in started][:3] == [0, 1, 2]


def batch_rollouts(o: Overlap, events: list, slow=(0,), fail=None):
    """Rollouts whose batches are made in tasks of their own (`o.run_batch`): batch b's generation takes 50 ms for b
    in `slow`, each batch's episodes sit in the buffer a while before `added` counts them, and batch `fail` raises."""

    async def make(b):
        events.append(("generate", b, o.published))
        await asyncio.sleep(0.05 if b in slow else 0.01)
        if b == fail:
            raise RuntimeError(f"batch {b} failed to score")
        await o.turn(b)
        await o.buffer.route().add.call_one([b, b])
        await asyncio.sleep(0.02)  # in the buffer, not yet counted: no snapshot may fall in here
        events.append(("landed", b))
        o.added(2, {"rollout/batch": float(b)}, [])

    async def rollouts():
        async for b in o.rollout_batches():
            o.run_batch(make(b))

    return rollouts()


def test_batches_are_made_at_once_within_the_policy_age_and_land_in_order(tmp_path):
    o, events = overlap(tmp_path, max_policy_age=1), []
    trained = train_on(o, batch_rollouts(o, events))
    assert [step for step, _ in trained] == [1, 2, 3]
    assert [episodes for _, episodes in trained] == [[0, 0], [0, 0], [0, 0]]  # (the fake buffer's first n)
    # batch 1 began while batch 0 was still being made (it is slow), and still landed after it
    assert events.index(("generate", 1, 0)) < events.index(("landed", 0)) < events.index(("landed", 1))
    landed = [e[1] for e in events if e[0] == "landed"]
    assert landed == sorted(landed) and landed[:3] == [0, 1, 2]
    # the policy-age gate counts the batches begun, landed or not: never more than one version ahead
    assert all(e[1] - e[2] <= 1 for e in events if e[0] == "generate")


def test_with_max_policy_age_0_one_batch_is_made_at_a_time(tmp_path):
    o, events = overlap(tmp_path, max_policy_age=0), []
    train_on(o, batch_rollouts(o, events, slow=(0, 1, 2)))
    kinds = [e[:2] for e in events]
    for b in (1, 2):  # batch b begins only after batch b - 1 landed (and was trained on)
        assert kinds.index(("landed", b - 1)) < kinds.index(("generate", b))


@pytest.mark.parametrize("waves", [False, True])
def test_rollout_waves_begin_a_wave_together_once_every_batch_before_it_has_trained(tmp_path, waves):
    o, events = overlap(tmp_path, max_policy_age=1, waves=waves), []
    assert [step for step, _ in train_on(o, batch_rollouts(o, events, slow=()))] == [1, 2, 3]
    began = {e[1]: e[2] for e in events if e[0] == "generate"}  # batch: the version published when it began
    kinds = [e[:2] for e in events]
    assert began[0] == began[1] == 0 and kinds.index(("generate", 1)) < kinds.index(("landed", 0))
    if waves:  # batch 2 waits for batch 1's step: trained at versions 2 and 3, batches 2 and 3 are 0 and 1 old
        assert began[2] == 2 and kinds.index(("landed", 1)) < kinds.index(("generate", 2))
    else:  # batch 2 begins once batch 0 has trained: 1 version old when trained, as is every batch after it
        assert began[2] == 1


def test_a_checkpoint_waits_for_every_batch_in_flight_to_land(tmp_path):
    saved: list[str] = []
    o, events = overlap(tmp_path, max_policy_age=1, every=1, saved=saved), []
    snapshots = []
    take_snapshot = o.steps.snapshot

    async def snapshot():
        snapshots.append(await take_snapshot())
        return snapshots[-1]

    o.steps.snapshot = snapshot
    train_on(o, batch_rollouts(o, events, slow=(0, 1, 2, 3)))
    assert len(snapshots) == 3 and saved == [step_dir(tmp_path, n).name for n in (1, 2, 3)]
    for snap in snapshots:  # the buffer holds exactly what the loop counted: no batch was half landed
        assert snap["buffer"]["held"] == snap["episodes_added"]


def test_a_batch_that_fails_fails_the_run_with_its_error(tmp_path):
    o, events = overlap(tmp_path, max_policy_age=1), []
    with pytest.raises(RuntimeError, match="batch 1 failed to score"):
        train_on(o, batch_rollouts(o, events, fail=1))


def test_a_stop_signal_between_steps_checkpoints_what_is_done_and_raises_stopped(tmp_path):
    saved: list[str] = []
    o = overlap(tmp_path, max_policy_age=1, every=100, saved=saved)

    async def rollouts():
        async for b in o.rollout_batches():
            await o.buffer.route().add.call_one([b, b])
            o.added(2, {}, [])

    async def train():
        async with o.running(rollouts()):
            async for step, _ in o.training_batches():
                o.publish(step, {}, torch.tensor([step - 1]))
                STOP.signum = signal.SIGTERM  # arrives while step 1 trains

    with pytest.raises(Stopped) as stopped:
        asyncio.run(train())
    assert stopped.value.step == 1 and stopped.value.checkpoint == str(step_dir(tmp_path, 1))
    assert saved == [step_dir(tmp_path, 1).name] and stopped.value.exit_code == 143
