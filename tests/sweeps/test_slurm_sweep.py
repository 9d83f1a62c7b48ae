"""Sweeps through submitit on the real single-node SLURM: one job array, one MLflow child run per job under a parent
that holds the summary table; a cancelled job ends the sweep with a clear error; a requeued job resumes into the
same child run with every step logged once."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.launchers.fixtures import run_script
from tests.sweeps.fixtures import isolated, sweep_command

pytestmark = pytest.mark.slurm


def children(client: MlflowClient, state: dict) -> list:
    return client.search_runs([state["experiment_id"]], f"tags.mlflow.parentRunId = '{state['parent_run_id']}'")


def git_head() -> str | None:
    import forge_exp.cli

    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                         cwd=Path(forge_exp.cli.__file__).parent)
    return out.stdout.strip() or None


def wait_for(what: str, fn, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the sweep ended (rc {proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.3)
    return value


def test_slurm_sweep_is_one_array_with_a_child_run_per_job(slurm_sweep):
    out = slurm_sweep.proc.stdout
    assert "submitted 4 jobs (slurm job " in out, out[-2000:]
    array_id = out.split("submitted 4 jobs (slurm job ", 1)[1].split(")")[0]
    assert array_id.isdigit(), f"expected one job array, got {array_id!r}"

    client = MlflowClient(slurm_sweep.uri)
    parent = client.get_run(slurm_sweep.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.algorithm.loss.beta"] == "0,0.04"
    assert parent.data.params["sweep.algorithm.loss.clip_high"] == "0.2,0.28"
    assert parent.data.tags["forge_exp.sweep.launcher"] == "SlurmLauncher"
    assert parent.data.metrics["sweep/jobs_finished"] == 4

    runs = children(client, slurm_sweep.state)
    assert len(runs) == 4
    pairs = {(float(r.data.params["algorithm.loss.beta"]), float(r.data.params["algorithm.loss.clip_high"])) for r in runs}
    assert pairs == set(itertools.product([0.0, 0.04], [0.2, 0.28]))
    head = git_head()
    for r in runs:
        tags = r.data.tags
        assert r.info.status == "FINISHED"
        assert tags["slurm.slurm_array_job_id"] == array_id
        assert tags["slurm.slurm_array_task_id"] == tags["forge_exp.sweep.job"]
        overrides = dict(o.split("=", 1) for o in tags["forge_exp.overrides"].split())
        assert float(overrides["algorithm.loss.beta"]) == float(r.data.params["algorithm.loss.beta"])
        assert tags.get("mlflow.source.git.commit") == head
        assert "summary/eval/accuracy_end" in r.data.metrics and "reward/mean" in r.data.metrics

    # the table: printed at the end, and an artifact of the parent run
    for r in runs:
        assert r.info.run_id in out
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "sweep/summary.json")).read_text())
    assert sorted(table["data"], key=str) and len(table["data"]) == 4
    assert {"algorithm.loss.beta", "algorithm.loss.clip_high", "accuracy_end", "reward", "kl", "wall_s"} <= set(table["columns"])


def test_cancelled_job_ends_the_sweep_with_a_clear_error(slurm_env, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    cmd = sweep_command("algorithm.beta=0", "algorithm.clip_high=0.2,0.28", "hydra/launcher=submitit_slurm",
                        root=tmp_path, uri=uri)
    # the child run is created once its first step is under way (tracker.begin()): enough steps after that for
    # the cancel to land while the job runs (~0.25 s each on an idle 2-core machine)
    cmd = [c for c in cmd if not c.startswith("steps=")] + ["steps=40"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=isolated(dict(os.environ), tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        state_file = tmp_path / "sweep" / "forge_sweep.json"
        state = json.loads(wait_for("sweep state file", lambda: state_file.exists() and state_file.read_text(), 60, proc))
        client = MlflowClient(uri)
        # cancel job #1 once its child run exists, so that the run it leaves behind is checked too
        child = wait_for("child run of job #1", lambda: [r for r in children(client, state)
                                                         if r.data.tags.get("forge_exp.sweep.job") == "1"], 90, proc)[0]
        slurm_job = f"{child.data.tags['slurm.slurm_array_job_id']}_1"
        run_script(["scancel", slurm_job], slurm_env)
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    error = next((ln for ln in err.splitlines() if "SweepJobError" in ln), err[-3000:])
    assert f"sweep job #1 (SLURM job {slurm_job}: algorithm.loss.beta=0 algorithm.loss.clip_high=0.28 " in error, error
    assert "ended CANCELLED without a result" in error, error
    assert "1 of 2 jobs failed" in out, out[-2000:]
    parent = client.get_run(state["parent_run_id"])
    assert parent.info.status == "FAILED"
    status = {r.data.tags["forge_exp.sweep.job"]: r.info.status for r in children(client, state)}
    assert status == {"0": "FINISHED", "1": "KILLED"}


def test_requeued_job_resumes_into_the_same_child_run(slurm_env, tmp_path):
    steps = 40  # ~0.25 s each on an idle 2-core machine: the requeue comes well before the end
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    cmd = sweep_command("algorithm.beta=0", "hydra/launcher=submitit_slurm", root=tmp_path, uri=uri)
    cmd = [c for c in cmd if not c.startswith("steps=")] + [f"steps={steps}", "checkpoint.every=5"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=isolated(dict(os.environ), tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ckpt = tmp_path / "sweep" / "0" / "checkpoints"
        wait_for("first checkpoint", lambda: any(ckpt.glob("step_*/state.json")), 120, proc)
        time.sleep(0.5)  # into the next interval: steps past the checkpoint are computed, then lost
        job_id = wait_for("job id", lambda: next((p.name for p in (tmp_path / "sweep" / ".submitit").iterdir()
                                                 if p.name.isdigit()), None), 10)
        run_script(["scontrol", "requeue", job_id], slurm_env)
        # a requeued job waits cred_expire (120 s by default) before it may start again: let it start now
        wait_for("the requeued job pending", lambda: "JobState=PENDING" in run_script(
            ["scontrol", "show", "job", job_id], slurm_env).stdout, 60, proc)
        run_script(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], slurm_env)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert "Restarts=1" in run_script(["scontrol", "show", "job", job_id], slurm_env).stdout
    log = "".join(p.read_text() for p in (tmp_path / "sweep" / ".submitit" / job_id).glob("*_log.out"))
    assert "job #0 runs again after a requeue: resume=true" in log

    client = MlflowClient(uri)
    state = json.loads((tmp_path / "sweep" / "forge_sweep.json").read_text())
    (child,) = children(client, state)
    assert child.info.status == "FINISHED"
    for key in ("loss/total", "train/version", "time/step_seconds"):  # every step (reward/mean: when a rollout ended)
        history = sorted(m.step for m in client.get_metric_history(child.info.run_id, key))
        assert history == list(range(1, steps + 1)), f"{key}: steps logged {history}"
    assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "eval/accuracy")) == [0, steps]

