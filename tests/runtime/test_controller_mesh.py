"""`mesh: controller` (the default services=cpu for the light services): the dataset, reward workers and replay
buffer are real actors in the controller's own process: they do their job and no process is spawned for them."""

from __future__ import annotations

import asyncio
import os

import psutil

from forge_exp.actors.dataset import DatasetService
from forge_exp.actors.replay_buffer import ReplayBufferService
from forge_exp.actors.reward import RewardWorker
from forge_exp.config.services import ServicesConfig, ServiceSpec
from forge_exp.rl.types import Completion, Episode, Group, Problem
from forge_exp.runtime.layout import plan_meshes
from forge_exp.runtime.services import Runtime
from tests.config.helpers import typed

CFG = typed("dataset.eval_size=16")


def children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


async def exercise() -> dict:
    here = ServiceSpec(mesh="controller")
    layout = ServicesConfig(dataset=here, reward=here, replay_buffer=here)
    out = {}
    async with Runtime(plan_meshes(layout, {"dataset", "reward", "replay_buffer"})) as runtime:
        dataset = runtime.spawn("dataset", DatasetService, CFG.dataset, CFG.model)
        reward = runtime.spawn("reward", RewardWorker, CFG.reward)
        buffer = runtime.spawn("replay_buffer", ReplayBufferService, 1, 0)
        out["problems"] = await dataset.route().sample.call_one(3)
        group = Group(Problem("1+2=", "3"), [
            Completion([1], [5], [-0.1], "eos", 0, text="3"), Completion([1], [6], [-0.1], "eos", 0, text="4"),
        ])
        out["scored"] = await reward.route().score.call_one([group])
        out["size"] = await buffer.route().add.call_one([Episode(c, 1.0, 0.5) for c in group.completions])
        out["batch"] = await buffer.route().sample.call_one(2, 0)
        out["children"] = children()
        out["procs"] = dict(runtime.procs)
    return out


def test_light_services_run_in_the_controllers_process():
    before = children()
    out = asyncio.run(exercise())
    assert len(out["problems"]) == 3 and all(p.prompt.endswith("=") for p in out["problems"])
    assert out["scored"][0].rewards == [1.0, 0.0]
    assert out["size"] == 2 and len(out["batch"]) == 2
    assert out["procs"] == {} and out["children"] - before == set()  # no proc mesh, no process
