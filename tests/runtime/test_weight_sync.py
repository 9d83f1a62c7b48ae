"""Weight sync trainer → generator through real Monarch processes: the process-local copy (trainer and generator in
one process), shared memory (separate CPU processes) and, where CUDA exists, CUDA IPC (separate processes on
GPUs); the message path (another host) in one process. Each checks that the generator ends up with the trainer's exact weights, stamps its completions with the
version it loaded, and loads a new version only before its next batch."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from forge_exp.rl.types import Problem
from forge_exp.runtime.layout import MeshPlan
from forge_exp.runtime.weight_sync import WeightPublisher, WeightReceiver, layout_of, parameters, views
from tests.config.helpers import typed
from tests.conftest import ROOT
from tests.models.helpers import build_tiny

CFG = typed("algorithm.beta=0")
PROBLEMS = [Problem(prompt="12+34=", target="46")]


def plans(trainer_device: str, generator_device: str, colocated: bool) -> dict[str, MeshPlan]:
    gpus = int(trainer_device.startswith("cuda"))
    if colocated:
        return {"colo": MeshPlan("colo", ["trainer", "generator"], 1, 1, gpus, 1, devices=[[trainer_device]])}
    return {
        "trainer": MeshPlan("trainer", ["trainer"], 1, 1, gpus, 1, devices=[[trainer_device]]),
        "generator": MeshPlan("generator", ["generator"], 1, 1, gpus, 1, devices=[[generator_device]]),
    }


async def sync_round_trip(meshes: dict[str, MeshPlan]) -> dict:
    from forge_exp.runtime.services import Runtime
    from tests.runtime.weight_sync_actors import ProbeGenerator, ProbeTrainer

    out = {}
    async with Runtime(meshes) as runtime:
        trainer = runtime.spawn("trainer", ProbeTrainer, CFG.trainer, CFG.model, CFG.algorithm, None, 0,
                                CFG.algorithm.loss_inputs).route()
        generators = runtime.spawn("generator", ProbeGenerator, CFG.generator, CFG.model, None, 0)
        generator = generators.route()

        assert await trainer.perturb.call_one(0.05) == 1
        out["seconds"] = (await trainer.push_weights.call_one(generators.fanout()))["sync/seconds"]
        out["transport"] = await generator.transport.call_one()
        groups, metrics = await generator.generate.call_one(PROBLEMS, 2, 1.0, 1.0, 4)
        out["version_1"] = {c.policy_version for c in groups[0].completions}
        out["equal_1"] = await generator.digest.call_one() == await trainer.digest.call_one()

        # version 2 is pushed while the generator still holds 1: it must not change before the next batch
        held = await generator.digest.call_one()
        assert await trainer.perturb.call_one(0.05) == 2
        await trainer.push_weights.call_one(generators.fanout())
        out["unchanged_until_next_batch"] = await generator.digest.call_one() == held
        groups, metrics = await generator.generate.call_one(PROBLEMS, 2, 1.0, 1.0, 4)
        out["version_2"] = {c.policy_version for c in groups[0].completions}
        out["metrics_version"] = metrics["generator/version"]
        out["equal_2"] = await generator.digest.call_one() == await trainer.digest.call_one()
    return out


def check(out: dict, transport: str) -> None:
    assert out["transport"] == transport
    assert out["version_1"] == {1} and out["equal_1"]
    assert out["unchanged_until_next_batch"]
    assert out["version_2"] == {2} and out["metrics_version"] == 2 and out["equal_2"]


@pytest.fixture(autouse=True)
def _actors_import_tests(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.mark.slow
def test_colocated_generator_copies_from_the_trainer_in_its_process():
    check(asyncio.run(sync_round_trip(plans("cpu", "cpu", colocated=True))), "local")


@pytest.mark.slow
def test_separate_cpu_processes_use_shared_memory():
    check(asyncio.run(sync_round_trip(plans("cpu", "cpu", colocated=False))), "shm")


@pytest.mark.slow
def test_every_generator_replica_gets_the_version():
    """services.generator.replicas=2 (the 4-GPU layout's shape, here on CPU): one push reaches both."""
    from forge_exp.runtime.services import Runtime
    from tests.runtime.weight_sync_actors import ProbeGenerator, ProbeTrainer

    meshes = plans("cpu", "cpu", colocated=False)
    meshes["generator"] = MeshPlan("generator", ["generator"], 2, 1, 0, 1, devices=[["cpu"], ["cpu"]])

    async def run():
        async with Runtime(meshes) as runtime:
            trainer = runtime.spawn("trainer", ProbeTrainer, CFG.trainer, CFG.model, CFG.algorithm, None, 0,
                                    CFG.algorithm.loss_inputs).route()
            generators = runtime.spawn("generator", ProbeGenerator, CFG.generator, CFG.model, None, 0)
            await trainer.perturb.call_one(0.05)
            await trainer.push_weights.call_one(generators.fanout())
            want = await trainer.digest.call_one()
            out = []
            for i in range(2):
                replica = generators.replica(i)
                groups, _ = await replica.generate.call_one(PROBLEMS, 1, 1.0, 1.0, 2)
                out.append((groups[0].completions[0].policy_version, await replica.digest.call_one() == want))
            return out

    assert asyncio.run(run()) == [(1, True), (1, True)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_separate_gpu_processes_use_cuda_ipc():
    last = torch.cuda.device_count() - 1  # GPU 0 → GPU 1 where there are two; else both on GPU 0
    out = asyncio.run(sync_round_trip(plans("cuda:0", f"cuda:{last}", colocated=False)))
    print(f"cuda:0 -> cuda:{last}: {out}")
    check(out, "ipc")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_colocated_on_gpu_copies_device_to_device():
    check(asyncio.run(sync_round_trip(plans("cuda:0", "cuda:0", colocated=True))), "local")


# ------------------------------------------------------------------------------------ the pieces, in one process
def tiny(seed: int) -> torch.nn.Module:
    return build_tiny(seed=seed)[0]


def test_layout_aligns_every_tensor_and_views_round_trip():
    params = parameters(tiny(0))
    slots, nbytes = layout_of(params)
    assert all(s.offset % 256 == 0 for s in slots) and nbytes >= sum(s.nbytes for s in slots)
    buffer = torch.zeros(nbytes, dtype=torch.uint8)
    torch._foreach_copy_(views(buffer, slots), list(params.values()))
    for view, p in zip(views(buffer, slots), params.values()):
        assert torch.equal(view, p.detach())


def test_tied_embeddings_are_sent_once():
    model = tiny(0)
    assert model.config.tie_word_embeddings
    names = list(parameters(model))
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names


def test_receiver_asks_for_the_state_when_it_cannot_reach_the_trainer():
    trainer, generator = tiny(0), tiny(1)
    publisher, receiver = WeightPublisher(trainer), WeightReceiver(generator, torch.device("cpu"))
    ref = publisher.publish(3)
    ref.pid, ref.host = -1, "another-host"  # as if from a process on another host
    assert receiver.receive(ref) == "state?"
    assert not publisher.update(["state?"])
    ref = publisher.publish(3)
    ref.pid, ref.host = -1, "another-host"
    assert receiver.receive(ref) == "message"
    receiver.load()
    assert all(torch.equal(a, b) for a, b in zip(trainer.parameters(), generator.parameters()))


def test_shared_memory_snapshot_is_private_until_the_next_push():
    """Another process on this host (faked by the pid): the generator asks for the shared buffer, copies each version
    out of it, and what it loads is the version it received even after the trainer moved on."""
    trainer, generator = tiny(0), tiny(1)
    publisher, receiver = WeightPublisher(trainer), WeightReceiver(generator, torch.device("cpu"))

    def push(version):
        replies = []
        for _ in range(2):
            ref = publisher.publish(version)
            ref.pid = -1  # not this process: no process-local copy
            replies = [receiver.receive(ref)]
            if publisher.update(replies):
                return replies, ref
        raise AssertionError(replies)

    assert push(1)[0] == ["shm"] and publisher.offer_shm and not publisher.send_state
    v1 = [p.detach().clone() for p in trainer.parameters()]
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.5)  # the next version, written into the shared buffer by the next publish
    _, ref = push(2)
    assert ref.state is None  # nothing heavy in the message
    v2 = [p.detach().clone() for p in trainer.parameters()]
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.5)
    publisher.publish(3)  # version 3 in the shared buffer; the generator took 2 and has not loaded it yet
    receiver.load()
    assert all(torch.equal(g, b) for g, b in zip(generator.parameters(), v2))
    assert not any(torch.equal(g, a) for g, a in zip(generator.parameters(), v1))


def test_unreadable_shared_memory_falls_back_to_the_state():
    trainer, generator = tiny(0), tiny(1)
    publisher, receiver = WeightPublisher(trainer), WeightReceiver(generator, torch.device("cpu"))
    publisher.offer_shm = True
    ref = publisher.publish(1)
    ref.pid, ref.shm = -1, (2**22 + 1, 3, ref.shm[2])  # no such process
    assert receiver.receive(ref) == "state?"
    assert publisher.update(["state?"]) is False and publisher.send_state
    ref = publisher.publish(1)
    ref.pid = -1
    assert receiver.receive(ref) == "message"  # the shared buffer is not tried again
    receiver.load()
    assert all(torch.equal(a, b) for a, b in zip(trainer.parameters(), generator.parameters()))


def test_a_different_model_is_one_clear_error():
    publisher = WeightPublisher(tiny(0))
    other = build_other()
    with pytest.raises(ValueError, match="trainer and generator models differ"):
        WeightReceiver(other, torch.device("cpu")).receive(publisher.publish(1))


def build_other() -> torch.nn.Module:
    return build_tiny(num_layers=2)[0]
