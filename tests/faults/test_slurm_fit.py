"""A sweep whose SLURM jobs could never start, on a SLURM that advertises what a 2-core machine has (the session's
cluster advertises 16 CPUs so that sweeps run side by side: it would hide this). Asking 4 CPUs a job (the default
`services` layout) is refused before anything is submitted, naming the key; a job that is submitted but that SLURM
keeps PENDING for a reason that never clears ends the wait in one line, its jobs cancelled. Exit code 2 both."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from mlflow.tracking import MlflowClient

from forge_exp.launch.slurm_fit import _gpus, _minutes, never_clears
from tests.faults.helpers import last_line
from tests.launchers.fixtures import (
    SLURM_DIR, live_processes, missing_slurm_commands, run_script, slurm_environ, start_env,
)
from tests.sweeps.fixtures import isolated, sweep_command

GRID = ["algorithm.beta=0,0.04", "algorithm.clip_high=0.2,0.28"]  # the README's sweep


@pytest.fixture(scope="module")
def two_cpus(tmp_path_factory):
    """A private single-node SLURM (launchers/slurm/start.sh) whose node has 2 CPUs, stopped at the end."""
    if missing := missing_slurm_commands():
        pytest.skip(f"SLURM/munge not installed (missing {', '.join(missing)})")
    state = tmp_path_factory.mktemp("slurm2")
    run_script([str(SLURM_DIR / "start.sh")], {**start_env(state), "FORGE_SLURM_CPUS": "2"})
    env = slurm_environ(state)
    try:
        assert "|2|" in f"|{run_script(['sinfo', '-h', '-o', '%c'], env).stdout.strip()}|"
        yield env
    finally:
        run_script([str(SLURM_DIR / "stop.sh")], env)
        assert live_processes(("slurmstepd", "slurmd", "slurmctld", "munged"),
                              env_match=f"SLURM_CONF={state}/slurm.conf") == []


def sweep(env: dict, root, *overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(sweep_command(*overrides, "hydra/launcher=submitit_slurm", root=root), cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - t0


def queue(env: dict) -> list[str]:
    return run_script(["squeue", "-h", "-o", "%i %T %r"], env).stdout.split("\n")[:-1]


@pytest.mark.slurm
def test_a_request_no_node_has_is_refused_before_anything_is_submitted(two_cpus, tmp_path):
    proc, seconds = sweep(isolated(two_cpus, tmp_path), tmp_path, *GRID)  # (an empty cluster file)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "forge-exp: error: hydra.launcher.cpus_per_task=4 (sized from services: 1 for the controller and 1 for each "
        "torch thread of its processes) is more than any node of partition debug has (2 CPUs); lower "
        "services.<name>.threads, or set hydra.launcher.cpus_per_task=2 (the processes then share CPUs)"]
    assert queue(two_cpus) == [] and not (tmp_path / "mlruns").exists()  # nothing submitted, no parent run
    print(f"refused in {seconds:.1f} s")


@pytest.mark.slurm
def test_a_job_slurm_keeps_pending_for_good_ends_the_wait_and_is_cancelled(two_cpus, tmp_path):
    """A reason the check before submitting cannot see: the job depends on one that failed."""
    failed = run_script(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "false"], two_cpus).stdout.strip()
    deadline = time.monotonic() + 60
    while "FAILED" not in run_script(["scontrol", "show", "job", failed], two_cpus).stdout:
        assert time.monotonic() < deadline, "the job meant to fail did not"
        time.sleep(0.5)
    (tmp_path / "depends.yaml").write_text(f"additional_parameters: {{dependency: 'afterok:{failed}'}}\n")
    env = {**two_cpus, "FORGE_EXP_CLUSTER_CONFIG": str(tmp_path / "depends.yaml")}  # the user's cluster file
    proc, seconds = sweep(env, tmp_path, "algorithm.beta=0,0.04", "hydra.launcher.cpus_per_task=2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    m = re.fullmatch(r"forge-exp: error: sweep SLURM job (\d+)\S* can never start: it is PENDING with reason "
                     r"DependencyNeverSatisfied \(a job it depends on \(hydra\.launcher\.additional_parameters\) "
                     r"failed\); the sweep's jobs are cancelled \(scancel (\d+)\)", last_line(proc.stderr))
    assert m and m[1] == m[2], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and seconds < 120, seconds  # two polls of the launcher, 2 s apart
    assert not [line for line in queue(two_cpus) if " PENDING " in line]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (parent,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert parent.info.status == "FAILED" and parent.data.tags["forge_exp.sweep"] == "parent"
    print(f"stopped in {seconds:.1f} s")


def test_slurm_limits_and_reasons_are_read_as_slurm_writes_them():
    assert [_minutes(t) for t in ("infinite", "UNLIMITED", "60", "1:30:00", "2-00:00:00", "0:00:30")] == [
        None, None, 60, 90, 2880, 1]
    assert [_gpus(g) for g in ("(null)", "gpu:4", "gpu:a100:8(S:0-1)", "gpu:2,gpu:v100:2")] == [0, 4, 8, 4]
    assert [never_clears(r) for r in ("PartitionConfig", "ReqNodeNotAvail, UnavailableNodes:n1", "Resources",
                                      "Priority", "QOSMaxCpuPerJobLimit", "DependencyNeverSatisfied")] == [
        True, True, False, False, True, True]
