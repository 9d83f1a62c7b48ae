"""runtime/hosts.py: proc meshes on the hosts of a Monarch job, spawned and shaped as on this host. The job here is
Monarch's ProcessJob (each "host" a local worker process: real Monarch workers and host meshes, one machine); the
same code over a SLURM allocation is tests/launchers/test_multihost.py, on the dev SLURM."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from forge_exp.config.services import ServiceSpec, ServicesConfig
from forge_exp.runtime.slurm_job import squeue_job
from forge_exp.runtime.layout import plan_meshes
from tests.conftest import ROOT
from tests.launchers.fixtures import pid_alive


@pytest.fixture(autouse=True)
def _actors_import_tests(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


async def _two_hosts_each() -> dict:
    from monarch.job import ProcessJob

    from forge_exp.runtime.hosts import ClusterHosts
    from forge_exp.runtime.services import Runtime
    from tests.runtime.hosts_actors import RankProbe, WhereAmI

    layout = ServicesConfig(trainer=ServiceSpec(procs=2), generator=ServiceSpec(replicas=4, gpus=1))
    # (the generator's gpus=1 only shapes its device table: WhereAmI never touches a GPU)
    plans = plan_meshes(layout, {"trainer", "generator"}, hosts={"trainer": 2, "generator": 2})
    job = ProcessJob({"trainer": 2, "generator": 2})
    hosts = ClusterHosts(job, ["trainer", "generator"])
    async with Runtime(plans, hosts=hosts) as runtime:
        workers = {name: state.pid for name, state in job._host_to_pid.items()}
        generator = runtime.spawn("generator", WhereAmI)
        routed = [await generator.route().where.call_one() for _ in range(4)]
        trainer = await runtime.spawn_collective("trainer", RankProbe, backend="gloo")
        ranks = sorted((await trainer.fanout().ranks.call()).values(), key=lambda r: r["rank"])
        placement = await hosts.placement()
        pids = {r["pid"] for r in routed} | {p["pid"] for m in placement["meshes"].values() for p in m}
    return {"workers": workers, "routed": routed, "ranks": ranks, "placement": placement, "pids": pids}


@pytest.mark.slow  # ~50 s on 2 cores: 4 host workers and 6 procs, each importing torch and transformers
def test_meshes_spread_over_two_hosts_route_and_rank_as_on_one_then_stop():
    out = asyncio.run(_two_hosts_each())
    workers = out["workers"]
    generator_hosts = {workers["generator_0"], workers["generator_1"]}
    # 4 generator replicas, 2 per host: route() reaches each once; each host numbers its devices from 0
    assert [r["replica"] for r in out["routed"]] == [0, 1, 2, 3]
    assert [r["devices"] for r in out["routed"]] == [["cuda:0"], ["cuda:1"], ["cuda:0"], ["cuda:1"]]
    assert {r["parent"] for r in out["routed"][:2]} != {r["parent"] for r in out["routed"][2:]}
    assert {r["parent"] for r in out["routed"]} == generator_hosts
    # one torch.distributed world of 2 ranks, one per host: global ranks 0 and 1, each local rank 0 of 1
    assert [(r["rank"], r["world"], r["sum"]) for r in out["ranks"]] == [(0, 2, 3.0), (1, 2, 3.0)]
    assert [(r["local_rank"], r["local_world"], r["devices"]) for r in out["ranks"]] == [(0, 1, ["cpu"])] * 2
    assert {r["parent"] for r in out["ranks"]} == {workers["trainer_0"], workers["trainer_1"]}
    assert sorted(out["placement"]["meshes"]) == ["generator", "trainer"]
    assert len(out["placement"]["meshes"]["generator"]) == 4
    # stop(): the proc meshes, then the host meshes and the job: no worker and no proc is left
    assert [p for p in [*workers.values(), *out["pids"]] if pid_alive(p)] == []


def test_a_default_run_does_not_load_monarchs_job_api():
    # monarch.job costs ~0.3 s of start-up: only cluster=slurm imports it (runtime/slurm_job.py)
    probe = ("import sys, forge_exp.cli, forge_exp.runtime.services, forge_exp.runtime.hosts\n"
             "print('monarch.job' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]


# ---- squeue --json, as SLURM 22.05 and 23.02+ print it --------------------------------------------------------------

SQUEUE_22_05 = {"jobs": [  # every job, whatever --job says; nodes as allocated_nodes[].nodename
    {"job_id": 6, "job_state": "CANCELLED", "job_resources": None, "nodes": ""},
    {"job_id": 7, "job_state": "RUNNING", "nodes": "vm,vm2",
     "job_resources": {"nodes": "vm,vm2", "allocated_hosts": 2,
                       "allocated_nodes": [{"nodename": "vm", "cpus_used": 0}, {"nodename": "vm2", "cpus_used": 0}]}},
]}
SQUEUE_23_02 = {"jobs": [
    {"job_id": 7, "job_state": ["RUNNING"], "job_resources": {"nodes": {"allocation": [{"name": "vm"}, {"name": "vm2"}]}}},
]}


@pytest.mark.parametrize("answer", [SQUEUE_22_05, SQUEUE_23_02], ids=["slurm-22.05", "slurm-23.02"])
def test_squeue_json_of_either_slurm_reads_as_monarch_expects(answer):
    job = squeue_job(answer, "7")
    assert job["job_state"] == ["RUNNING"]
    assert [n["name"] for n in job["job_resources"]["nodes"]["allocation"]] == ["vm", "vm2"]
    assert squeue_job(answer, "8") is None


def test_pending_job_of_slurm_22_05_has_no_nodes_yet():
    job = squeue_job({"jobs": [{"job_id": 9, "job_state": "PENDING", "job_resources": None}]}, "9")
    assert job["job_state"] == ["PENDING"]  # (SlurmJob reads the nodes only once the job runs)


def test_the_cluster_option_decides_whether_the_run_has_cluster_hosts(tmp_path):
    """cluster=local keeps every mesh here; cluster=slurm's meshes get a job, named after the run, logging under its
    output dir (nothing is submitted until start())."""
    from forge_exp.config.cluster import LocalCluster, SlurmCluster
    from forge_exp.runtime.hosts import hosts_for

    meshes = plan_meshes(ServicesConfig(), {"trainer", "generator"}, hosts={"trainer": 1})
    assert hosts_for(LocalCluster(), plan_meshes(ServicesConfig(), {"trainer"}), "run", str(tmp_path)) is None
    hosts = hosts_for(SlurmCluster(), meshes, "my run", str(tmp_path))
    assert hosts.names == ["trainer"] and hosts.describe == {"scheduler": "slurm", "logs": str(tmp_path / "slurm")}
    assert hosts.job._job_name == "forge-exp-my_run"
