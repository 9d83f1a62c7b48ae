"""The services on real Monarch proc meshes: spawning from the services layout, route/fanout across replicas,
and the light services (dataset, reward workers, replay buffer) doing their job in their own processes."""

from __future__ import annotations

import asyncio
import os

import psutil

from forge_exp.actors.dataset import DatasetService
from forge_exp.actors.generator import Generator
from forge_exp.actors.replay_buffer import ReplayBufferService
from forge_exp.actors.reward import RewardWorker
from forge_exp.config.services import ServicesConfig, ServiceSpec
from forge_exp.rewards.combine import component_means
from forge_exp.rl.types import Completion, Episode, Group, Problem
from forge_exp.runtime.layout import plan_meshes
from forge_exp.runtime.services import Runtime
from tests.config.helpers import typed

CFG = typed("dataset.eval_size=16")


def children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


async def exercise() -> dict:
    layout = ServicesConfig(generator=ServiceSpec(mesh="generator", replicas=2), reward=ServiceSpec(mesh="host"))
    out = {}
    async with Runtime(plan_meshes(layout, {"dataset", "generator", "reward", "replay_buffer"})) as runtime:
        dataset = runtime.spawn("dataset", DatasetService, CFG.dataset, CFG.model)
        generator = runtime.spawn("generator", Generator, CFG.generator, CFG.model, None, 0)
        reward = runtime.spawn("reward", RewardWorker, CFG.reward)
        buffer = runtime.spawn("replay_buffer", ReplayBufferService, 1, 0)

        problems = await dataset.route().sample.call_one(3)
        out["problems"] = problems
        out["heldout"] = await dataset.route().eval_problems.call_one()
        # two replicas, reached in turn
        for _ in range(2):
            groups, _ = await generator.route().generate.call_one(problems, 4, 1.0, 1.0, 4)
        out["groups"] = groups
        out["fanout"] = await generator.fanout().pad_id.call()
        out["children_while_running"] = children()

        answer = Group(Problem("1+2=", "3"), [
            Completion([1], [5], [-0.1], "eos", 0, text="3"), Completion([1], [6], [-0.1], "eos", 0, text="4"),
        ])
        scored = await reward.route().score.call_one([answer])
        out["scored"] = scored[0]

        episodes = [Episode(c, 1.0, 0.5) for c in groups[0].completions]
        out["size"] = await buffer.route().add.call_one(episodes)
        out["too_few"] = await buffer.route().sample.call_one(5, 0)
        out["batch"] = await buffer.route().sample.call_one(4, 0)
    out["children_after"] = children()
    return out


def test_services_on_real_proc_meshes():
    before = children()
    out = asyncio.run(exercise())
    assert len(out["problems"]) == 3 and all(p.prompt.endswith("=") for p in out["problems"])
    assert len(out["heldout"]) == 16
    assert not {p.prompt for p in out["problems"]} & {p.prompt for p in out["heldout"]}
    groups = out["groups"]
    assert [len(g.completions) for g in groups] == [4, 4, 4]
    assert all(c.policy_version == 0 and len(c.token_ids) == len(c.logprobs) for g in groups for c in g.completions)
    assert len(list(out["fanout"].values())) == 2  # one answer per generator replica
    assert len(out["children_while_running"] - before) >= 3  # host, two generator replicas: real processes
    assert out["scored"].rewards == [1.0, 0.0] and out["scored"].correct == [True, False]
    assert component_means([out["scored"]])["exact"] == 0.5
    assert out["size"] == 4 and out["too_few"] is None and len(out["batch"]) == 4
    assert out["children_after"] - before == set(), "proc meshes left running after stop()"
