"""The single-node SLURM from launchers/slurm: sbatch, submitit (result, cancel), stop, and the sacct stand-in."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest

from .conftest import (
    SBIN_PATH,
    SLURM_DIR,
    live_processes,
    pid_alive,
    run_script,
    slurm_environ,
    start_cluster,
    start_env,
)

SACCT = SLURM_DIR / "sacct.py"


def sacct(env: dict[str, str], *ids: str) -> dict[str, str]:
    out = run_script(["sacct", "-o", "JobID,State,NodeList", "--parsable2", *[a for i in ids for a in ("-j", i)]], env)
    return {ln.split("|")[0]: ln.split("|")[1] for ln in out.stdout.splitlines()[1:]}


def wait_state(env: dict[str, str], job_id: str, want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (state := sacct(env, job_id).get(job_id)) != want:
        assert time.monotonic() < deadline, f"job {job_id} is {state}, not {want}, after {timeout}s"
        time.sleep(0.2)


def call_with_timeout(fn, timeout: float):
    """fn() in a daemon thread; (returned, raised, seconds). Fails the test if fn is still running after timeout."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"still waiting after {timeout}s"
    return box.get("value"), box.get("error"), time.monotonic() - t0


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_sbatch_job_completes(slurm_cluster, tmp_path):
    env = slurm_cluster
    assert run_script(["sinfo", "-h", "-o", "%P"], env).stdout.split() == ["debug*"]
    out = tmp_path / "job.out"
    # (not `sbatch --wait`: it polls every ~10 s)
    proc = run_script(["sbatch", "--parsable", "-o", str(out), "--wrap", "echo hello from $SLURM_JOB_ID"], env)
    job_id = proc.stdout.strip().split(";")[0]
    wait_state(env, job_id, "COMPLETED", timeout=30)
    assert out.read_text().strip() == f"hello from {job_id}"


def _add(a, b):
    return a + b


def _sleep_forever():
    time.sleep(600)


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_submitit_returns_result(slurm_env, tmp_path):
    import submitit

    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    executor.update_parameters(timeout_min=2, slurm_partition="debug")
    job = executor.submit(_add, 2, 3)
    value, error, secs = call_with_timeout(job.result, 30)
    assert error is None and value == 5, error
    wait_state(slurm_env, job.job_id, "COMPLETED", timeout=15)  # the result file may precede the job's end


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_cancelled_job_fails_promptly(slurm_env, tmp_path):
    """Without accounting the real sacct fails and submitit would wait forever for a cancelled job; the stand-in
    reports CANCELLED (from the jobcomp log, while scontrol still says COMPLETING) so result() raises."""
    import submitit
    from submitit.core.utils import UncompletedJobError

    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    executor.update_parameters(timeout_min=5)
    job = executor.submit(_sleep_forever)
    deadline = time.monotonic() + 20
    while job.get_info(mode="force").get("State") != "RUNNING":
        assert time.monotonic() < deadline, f"job never started: {job.get_info(mode='force')}"
        time.sleep(0.2)
    while not job.paths.stdout.exists() or "Loading pickle" not in job.paths.stdout.read_text():
        assert time.monotonic() < deadline, "the submitit worker did not start"
        time.sleep(0.2)

    job.cancel()  # scancel <id>; submitit's worker ignores the SIGTERM, slurm SIGKILLs it after KillWait
    # result() waits _results_timeout_s (15 s) for a result file that a cancelled job never writes
    job._results_timeout_s = 1
    _, error, secs = call_with_timeout(job.result, 25)
    assert isinstance(error, UncompletedJobError), error
    assert "CANCELLED" in str(error)
    assert secs < 20
    assert sacct(slurm_env, job.job_id) == {job.job_id: "CANCELLED"}


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_start_is_idempotent_and_stop_leaves_no_daemons(slurm_cluster, tmp_path_factory):
    """A second, private cluster (own state dir, ports and munged) next to the session one."""
    state = tmp_path_factory.mktemp("slurm-stop")
    env, _ = start_cluster(state)
    again = run_script([str(SLURM_DIR / "start.sh")], env)
    assert "already running" in again.stderr
    assert f'export SLURM_CONF="{state}/slurm.conf"' in again.stdout
    pids = {
        name: int((state / rel).read_text())
        for name, rel in [("slurmctld", "run/slurmctld.pid"), ("slurmd", "run/slurmd.pid"), ("munged", "munge/munged.pid")]
    }  # fmt: skip
    assert all(pid_alive(p) for p in pids.values()), pids
    job = run_script(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300"], env).stdout.strip()
    wait_state(env, job, "RUNNING", timeout=20)

    run_script([str(SLURM_DIR / "stop.sh")], env)
    assert [name for name, p in pids.items() if pid_alive(p)] == []
    conf_entry = f"SLURM_CONF={state}/slurm.conf"
    # no daemon, no step, and the job's own processes are gone too
    assert live_processes(("slurmstepd", "slurmd", "slurmctld", "munged", "sleep"), env_match=conf_entry) == []
    assert "not running" in run_script([str(SLURM_DIR / "stop.sh")], env).stderr
    # the session cluster is untouched
    assert "UP" in run_script(["scontrol", "ping"], slurm_cluster).stdout


def _shim(bin_dir, name: str, body: str):
    """An executable bin_dir/name running `body` (sh); bin_dir goes first on start.sh's PATH."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.slurm
@pytest.mark.timeout(90)
def test_start_waits_for_a_daemon_that_is_slow_to_exec(slurm_cluster, tmp_path_factory):
    """Right after the fork a daemon's pid still runs setsid (or the script); on a loaded machine that lasts. start.sh
    read such a pid as an exited daemon and failed, leaving the daemons it had started behind."""
    state = tmp_path_factory.mktemp("slurm-slow")
    real_setsid = shutil.which("setsid", path=SBIN_PATH)
    shims = _shim(state.parent / f"{state.name}-bin", "setsid", f'sleep 1\nexec {real_setsid} "$@"').parent
    env, proc = start_cluster(state, bin_first=shims)
    try:
        assert "started slurmctld" in proc.stderr and "node " in proc.stderr, proc.stderr
        assert "UP" in run_script(["scontrol", "ping"], env).stdout
    finally:
        run_script([str(SLURM_DIR / "stop.sh")], env)
    assert live_processes(("slurmd", "slurmctld", "munged"), env_match=f"SLURM_CONF={state}/slurm.conf") == []


@pytest.mark.slurm
@pytest.mark.timeout(90)
def test_start_waits_for_a_daemon_rewriting_its_pid_file(slurm_cluster, tmp_path_factory):
    """slurmctld writes its own pid file (SlurmctldPidFile), which reads empty between its truncation and the write;
    on a loaded machine start.sh read that as an exited daemon, failed, and left the slurmctld it had started
    running. Here the window lasts a second: start.sh checks the pid it spawned, not the file."""
    state = tmp_path_factory.mktemp("slurm-pidfile")
    real = shutil.which("slurmctld", path=SBIN_PATH)
    shims = _shim(state.parent / f"{state.name}-bin", "slurmctld",
                  f': > "{state}/run/slurmctld.pid"\nsleep 1\nexec {real} "$@"').parent
    env, proc = start_cluster(state, bin_first=shims)
    try:
        assert "started slurmctld" in proc.stderr and "UP" in run_script(["scontrol", "ping"], env).stdout
    finally:
        run_script([str(SLURM_DIR / "stop.sh")], env)
    assert live_processes(("slurmd", "slurmctld", "munged"), env_match=f"SLURM_CONF={state}/slurm.conf") == []


@pytest.mark.slurm
@pytest.mark.timeout(90)
def test_a_failed_start_stops_what_it_started(slurm_cluster, tmp_path_factory):
    """slurmd exits at once: start.sh fails naming it, and the munged and slurmctld it had started are stopped."""
    state = tmp_path_factory.mktemp("slurm-fail")
    shims = _shim(state.parent / f"{state.name}-bin", "slurmd", "echo 'slurmd: fatal: shimmed' >&2; exit 1").parent
    env = start_env(state, bin_first=shims)
    proc = subprocess.run([str(SLURM_DIR / "start.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "ERROR: slurmd exited" in proc.stderr and "slurmd: fatal: shimmed" in proc.stderr, proc.stderr
    assert "stopping pid" in proc.stderr
    pids = [int((state / rel).read_text()) for rel in ("run/slurmctld.pid", "munge/munged.pid") if (state / rel).exists()]
    assert pids == [], "pid files of stopped daemons are removed"
    # (the daemons' environment has this state dir's SLURM_CONF: exported by start.sh before munged starts)
    assert live_processes(("slurmd", "slurmctld", "munged"), env_match=f"SLURM_CONF={state}/slurm.conf") == []
    assert "not running" in run_script([str(SLURM_DIR / "stop.sh")], slurm_environ(state)).stderr
    assert "UP" in run_script(["scontrol", "ping"], slurm_cluster).stdout


# ---- the sacct stand-in against a fake scontrol: no cluster needed ------------------------------------------------

LIVE = """\
JobId=7 JobName=run a UserId=root(0) JobState=COMPLETING Reason=None ExitCode=0:0 RunTime=00:00:03 NodeList=vm NumNodes=1 NumCPUs=1 CPUs/Task=1
JobId=8 JobName=pend UserId=root(0) JobState=PENDING Reason=Priority NodeList=(null) NumNodes=1
JobId=12 ArrayJobId=10 ArrayTaskId=1 JobName=arr UserId=root(0) JobState=RUNNING NodeList=vm
JobId=10 ArrayJobId=10 ArrayTaskId=2-4%2 JobName=arr UserId=root(0) JobState=PENDING NodeList=(null)
JobId=13 JobName=req UserId=root(0) JobState=PENDING Reason=BeginTime NodeList=(null)
"""
JOBCOMP = """\
JobId=3 UserId=root(0) GroupId=root(0) Name=old JobState=TIMEOUT Partition=debug StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:05:00 NodeList=vm NodeCnt=1 ProcCnt=1 ExitCode=0:15
JobId=7 UserId=root(0) GroupId=root(0) Name=run a JobState=CANCELLED Partition=debug NodeList=vm ExitCode=0:0
JobId=11 UserId=root(0) GroupId=root(0) Name=arr JobState=COMPLETED NodeList=vm ArrayJobId=10 ArrayTaskId=0 ExitCode=0:0
JobId=13 UserId=root(0) GroupId=root(0) Name=req JobState=FAILED NodeList=vm ExitCode=1:0
"""


@pytest.fixture
def fake_slurm(tmp_path):
    (tmp_path / "live.txt").write_text(LIVE)
    (tmp_path / "jobcomp.log").write_text(JOBCOMP)
    (tmp_path / "slurm.conf").write_text(f"ClusterName=x\nJobCompLoc={tmp_path}/jobcomp.log\n")
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"if os.path.exists('{tmp_path}/down'): sys.exit('Unable to contact slurm controller')\n"
        f"print(open('{tmp_path}/live.txt').read(), end='')\n"
    )
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"), PATH=f"{scontrol.parent}:{os.environ['PATH']}")

    def run(*args: str, down: bool = False) -> str:
        (tmp_path / "down").unlink(missing_ok=True)
        if down:
            (tmp_path / "down").touch()
        return subprocess.run([sys.executable, str(SACCT), *args], env=env, capture_output=True, text=True,
                              check=True).stdout  # fmt: skip

    return run


def test_sacct_standin_as_submitit_reads_it(fake_slurm):
    from submitit.slurm.slurm import SlurmInfoWatcher

    out = fake_slurm("-o", "JobID,State,NodeList", "--parsable2", "-j", "3", "-j", "7", "-j", "8", "-j", "10",
                     "-j", "5", "-j", "13", "-j", "99")  # fmt: skip
    info = {k: v["State"] for k, v in SlurmInfoWatcher().read_info(out).items()}
    assert info == {
        "3": "TIMEOUT",  # purged from slurmctld: from the jobcomp log
        "7": "CANCELLED",  # scontrol says COMPLETING: the final state from the jobcomp log
        "8": "PENDING",
        "10_0": "COMPLETED",  # array task already purged
        "10_1": "RUNNING",
        "10_2": "PENDING", "10_3": "PENDING", "10_4": "PENDING",  # pending remainder 10_[2-4%2]
        "5": "FAILED",  # known to nobody although later ids exist: lost, reported terminal (not "unknown")
        "13": "PENDING",  # requeued: the live state wins over the earlier jobcomp record
    }  # fmt: skip
    assert "99" not in info  # not submitted yet: no line, like sacct


def test_sacct_standin_when_controller_down(fake_slurm):
    out = fake_slurm("-P", "-n", "-o", "jobid,state,exitcode", "-j", "3,8,5", down=True)
    assert out.splitlines() == ["3|TIMEOUT|0:15"]  # only what the jobcomp log knows; nothing is declared lost


def test_sacct_standin_default_format(fake_slurm):
    lines = fake_slurm("-j", "7").splitlines()
    assert lines[0].split() == ["JobID", "JobName", "Partition", "AllocCPUS", "State", "ExitCode"]
    assert lines[2].split() == ["7", "run", "a", "debug", "1", "CANCELLED", "0:0"]
