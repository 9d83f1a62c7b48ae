"""runtime/torch_world.py on a real Monarch proc mesh of 2 CPU processes: the world it sets up runs a gloo
all_reduce, then the TorchTitan trainer's FSDP parity check (2 ranks against one process, 3 AdamW steps)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def _actors_import_tests(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


async def _on_mesh(checkpoint: str | None, batches: str | None) -> dict:
    from monarch.actor import this_host

    from forge_exp.runtime.torch_world import close_torch_world, init_torch_world
    from tests.runtime.torch_world_actors import WorldProbe

    procs = this_host().spawn_procs(per_host={"procs": 2}, name="torch_world_test")
    try:
        world = await init_torch_world(procs, backend="gloo")
        probe = procs.spawn("probe", WorldProbe)
        out = {"all_reduce": sorted((await probe.all_reduce.call()).values())}
        if checkpoint is not None:
            out["steps"] = next(s for s in (await probe.parity.call(checkpoint, batches)).values() if s is not None)
        await close_torch_world(world)
        return out
    finally:
        await procs.stop()


@pytest.mark.slow
def test_gloo_world_over_a_monarch_mesh_all_reduces():
    out = asyncio.run(_on_mesh(None, None))
    assert out["all_reduce"] == [(0, 2, 3.0), (1, 2, 3.0)]


@pytest.mark.slow
def test_fsdp_parity_in_the_monarch_world(tmp_path):
    pytest.importorskip("torchtitan", reason="trainer=titan needs the titan extra")
    from tests.trainers.titan_cases import assert_same_steps, make_batches, run_world, tiny_model

    model = tiny_model("qwen3", seed=3)
    model.save_pretrained(tmp_path / "hf")
    torch.save(make_batches(model, seed=5), tmp_path / "batches.pt")
    checkpoint, batches = str(tmp_path / "hf"), str(tmp_path / "batches.pt")
    out = asyncio.run(_on_mesh(checkpoint, batches))
    assert out["all_reduce"] == [(0, 2, 3.0), (1, 2, 3.0)]
    single = run_world(1, tmp_path / "runs", "parity_job", checkpoint=checkpoint, batches=batches,
                       parallelism="single", grad_accum=2)
    assert_same_steps(out["steps"], single, "monarch fsdp=2")
