"""cluster=slurm on the dev SLURM (launchers/slurm): the trainer's mesh runs on a node of the run's own SLURM
allocation (monarch.job.SlurmJob → HostMesh), not on this_host(); the job and every process in it end with the run —
a finished one, a failed one and a Ctrl-C'd one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.launchers.fixtures import free_port, pid_alive, run_script

SHORT = ["steps=3", "dataset.eval_size=16", "progress=false"]


def job_processes(job_id: str, conf: str) -> set[int]:
    """Live processes of this cluster's SLURM job `job_id` (SLURM_JOB_ID and SLURM_CONF in their environment)."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={conf}".encode()}
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if want <= set((d / "environ").read_bytes().split(b"\0")) and pid_alive(int(d.name)):
                    found.add(int(d.name))
            except OSError:
                pass
    return found


def forge_jobs(env: dict[str, str]) -> dict[str, str]:
    """{job id: state} of the forge-exp jobs squeue lists (pending, running, completing)."""
    out = run_script(["squeue", "-h", "-o", "%i|%j|%T"], env).stdout
    return {i: s for i, name, s in (ln.split("|") for ln in out.splitlines()) if name.startswith("forge-exp-")}


def run_on_slurm(tmp_path, env, warmstart_cache, *args: str, timeout: float = 420,
                 interrupt_when_running: bool = False) -> dict:
    """`forge-exp cluster=slurm ...`, watching squeue and the job's processes while it runs."""
    cmd = [sys.executable, "-m", "forge_exp.cli", *args, "cluster=slurm", f"cluster.port={free_port()}",
           "cluster.timeout_min=15", f"hydra.run.dir={tmp_path}/run", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
           f"model.warmstart.cache_dir={warmstart_cache}"]
    run_env = {**env, "PYTHONPATH": str(ROOT)}  # the job's processes import tests.e2e.boom (sbatch passes the env on)
    assert forge_jobs(env) == {}, "a forge-exp job is already in the queue"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = {"job": None, "states": set(), "job_pids": set(), "local_pids": set(), "interrupted": False}
    start = time.monotonic()
    while proc.poll() is None:
        assert time.monotonic() - start < timeout, f"forge-exp still running after {timeout}s"
        jobs = forge_jobs(env)
        if seen["job"] is None and jobs:
            (seen["job"],) = jobs
        if seen["job"] is not None:
            seen["states"].add(jobs.get(seen["job"], "gone"))
            seen["job_pids"] |= job_processes(seen["job"], env["SLURM_CONF"])
        try:
            seen["local_pids"] |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        # the node's worker and at least one proc it started: the trainer's mesh is up
        if interrupt_when_running and not seen["interrupted"] and len(seen["job_pids"]) >= 2:
            time.sleep(3)
            proc.send_signal(signal.SIGINT)
            seen["interrupted"] = True
        time.sleep(0.3)
    out, err = proc.communicate()
    time.sleep(0.5)
    return {**seen, "code": proc.returncode, "out": out, "err": err}


def assert_nothing_left(run: dict, env: dict[str, str]) -> None:
    job = run["job"]
    assert job is not None, f"no forge-exp job ever appeared in squeue:\n{run['err'][-3000:]}"
    assert "RUNNING" in run["states"], run["states"]
    assert job not in forge_jobs(env), f"job {job} is still in the queue after the run"
    assert job_processes(job, env["SLURM_CONF"]) == set(), "processes of the job outlived the run"
    assert [p for p in run["job_pids"] | run["local_pids"] if pid_alive(p)] == [], "processes left behind"
    state = run_script(["sacct", "-n", "-P", "-o", "State", "-j", job], env).stdout.split()
    assert state in (["CANCELLED"], ["COMPLETED"]), state


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_the_trainer_mesh_runs_in_the_runs_slurm_allocation(slurm_cluster, tmp_path, warmstart_cache):
    run = run_on_slurm(tmp_path, slurm_cluster, warmstart_cache, *SHORT)
    assert run["code"] == 0, run["err"][-4000:]
    job = run["job"]
    assert_nothing_left(run, slurm_cluster)

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (mlflow_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.tags["forge_exp.hosts.job_id"] == job
    assert mlflow_run.data.params["cluster.hosts.trainer"] == "1"
    placement = json.loads(Path(client.download_artifacts(mlflow_run.info.run_id, "runtime/hosts.json",
                                                          str(tmp_path))).read_text())
    assert placement["job"]["job_id"] == job and list(placement["meshes"]) == ["trainer"]
    (trainer,) = placement["meshes"]["trainer"]  # services=cpu: one trainer process (the reference model's too)
    # the trainer's process said it runs in the job, and it was one of the job's processes, not forge-exp's child
    assert trainer["slurm_job_id"] == job
    assert trainer["pid"] in run["job_pids"] and trainer["pid"] not in run["local_pids"]
    assert trainer["command"][1:] == ["-m", "forge_exp.runtime.bootstrap"]  # started as the local procs are
    # the generator stayed on this host (and the light services in the controller): its own children, outside the job
    assert run["local_pids"] and not run["local_pids"] & run["job_pids"]
    logs = list((tmp_path / "run" / "slurm").glob(f"slurm_{job}_*.out"))
    assert logs, "no worker log in <run dir>/slurm"


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_failing_trainer_on_slurm_ends_the_job(slurm_cluster, tmp_path, warmstart_cache):
    """The trainer's loss raises at the first step inside its actor, on the SLURM node: the run fails with that
    error, and the job and its processes end all the same."""
    run = run_on_slurm(tmp_path, slurm_cluster, warmstart_cache, *SHORT,
                       "algorithm.loss._target_=tests.e2e.boom.BoomLoss")
    assert run["code"] != 0
    assert "boom at step 1" in run["err"], run["err"][-3000:]
    assert_nothing_left(run, slurm_cluster)


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_ctrl_c_ends_the_slurm_job(slurm_cluster, tmp_path, warmstart_cache):
    run = run_on_slurm(tmp_path, slurm_cluster, warmstart_cache, "steps=500", "progress=false",
                       interrupt_when_running=True)
    assert run["interrupted"] and run["code"] != 0
    assert_nothing_left(run, slurm_cluster)
