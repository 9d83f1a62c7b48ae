"""Fixtures for the dev/CI launchers: a real single-node SLURM cluster and an MLflow tracking server. A pytest plugin
(tests/conftest.py: pytest_plugins), so that tests/launchers, tests/sweeps and tests/browser share one cluster.

slurm_cluster (session): launchers/slurm/start.sh in a fresh state dir (or in $FORGE_SLURM_STATE_DIR if set, and then
  left running if it already was), yields the environment dict to run SLURM clients with (SLURM_CONF, PATH with the
  sacct stand-in, FORGE_SLURM_STATE_DIR); stop.sh at teardown. Skips only when the Debian packages are missing.
  The node advertises FORGE_SLURM_CPUS (default 16) CPUs, so that a sweep's jobs, which ask for the CPUs of their
  `services` layout, run side by side on a 2-core machine.
slurm_env (function): applies that environment to os.environ, for in-process clients such as submitit.
mlflow_server (function): launchers/mlflow_server.sh on a free port, store and state in the test's tmp_path
  (<tmp_path>/store/mlflow.db, <tmp_path>/art, state dir <tmp_path>/mlflow-state); yields the URI; stops it and
  asserts that no server process is left. running_mlflow_server(root) is the same as a context manager.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO / "launchers" / "slurm"
MLFLOW_SH = REPO / "launchers" / "mlflow_server.sh"
APT_PACKAGES = REPO / "launchers" / "apt-packages.txt"
SLURM_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo", "srun")
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def missing_slurm_commands() -> list[str]:
    return [c for c in SLURM_COMMANDS if shutil.which(c, path=SBIN_PATH) is None]


def pid_alive(pid: int) -> bool:
    """True for a live process; a zombie counts as dead (some sandboxes' PID 1 never reaps orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def live_processes(comms: tuple[str, ...], env_match: str | None = None) -> list[tuple[int, str]]:
    """(pid, comm) of live processes named in comms; with env_match, only those whose environment has that entry."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            if comm not in comms or not pid_alive(int(d.name)):
                continue
            if env_match is not None and env_match.encode() not in (d / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found.append((int(d.name), comm))
    return found


def run_script(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def slurm_environ(state_dir: Path) -> dict[str, str]:
    """The environment start.sh's env.sh describes, on top of os.environ."""
    env = dict(os.environ)
    env["FORGE_SLURM_STATE_DIR"] = str(state_dir)
    env["SLURM_CONF"] = str(state_dir / "slurm.conf")
    env["PATH"] = os.pathsep.join([str(state_dir / "bin"), SBIN_PATH])
    return env


def start_env(state_dir: Path, bin_first: Path | None = None) -> dict[str, str]:
    """start.sh's environment for state_dir; bin_first goes ahead of the system commands on PATH."""
    path = SBIN_PATH if bin_first is None else os.pathsep.join([str(bin_first), SBIN_PATH])
    env = dict(os.environ, FORGE_SLURM_STATE_DIR=str(state_dir), PATH=path)
    env.setdefault("FORGE_SLURM_CPUS", str(max(16, os.cpu_count() or 1)))
    return env


def start_cluster(state_dir: Path, bin_first: Path | None = None) -> tuple[dict[str, str], subprocess.CompletedProcess]:
    proc = run_script([str(SLURM_DIR / "start.sh")], start_env(state_dir, bin_first))
    return slurm_environ(state_dir), proc


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = missing_slurm_commands()
    if missing:
        pytest.skip(
            f"SLURM/munge not installed (missing {', '.join(missing)}): "
            f"apt-get install $(cat {APT_PACKAGES.relative_to(REPO)})"
        )
    given = os.environ.get("FORGE_SLURM_STATE_DIR")
    # a short path: the munge socket lives in the state dir and unix socket paths are limited to ~100 bytes
    state_dir = Path(given) if given else tmp_path_factory.mktemp("slurm")
    env, proc = start_cluster(state_dir)
    started_here = "already running" not in proc.stderr
    try:
        yield env
    finally:
        if started_here:
            run_script([str(SLURM_DIR / "stop.sh")], env)


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch):
    """slurm_cluster's environment applied to os.environ (submitit runs sbatch/sacct/scancel from this process)."""
    for key in ("FORGE_SLURM_STATE_DIR", "SLURM_CONF", "PATH"):
        monkeypatch.setenv(key, slurm_cluster[key])
    return slurm_cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_mlflow_server(root: Path):
    """launchers/mlflow_server.sh with store, artifacts and state under root; yields the URI, then stops it and
    asserts that no server process is left."""
    state = root / "mlflow-state"
    args = [
        str(MLFLOW_SH), "start", "--state-dir", str(state), "--port", str(free_port()),
        "--backend-store-uri", f"sqlite:///{root}/store/mlflow.db", "--artifacts-destination", str(root / "art"),
    ]  # fmt: skip
    proc = run_script(args, dict(os.environ), timeout=120)
    uri = proc.stdout.strip().rsplit("=", 1)[-1]
    pid = int((state / "mlflow.pid").read_text())
    try:
        yield uri
    finally:
        group = process_group(pid)
        run_script([str(MLFLOW_SH), "stop", "--state-dir", str(state)], dict(os.environ))
        left = [p for p in group + process_group(pid) if pid_alive(p)]
        assert not left, f"mlflow server processes left after stop: {left}"


@pytest.fixture
def mlflow_server(tmp_path):
    with running_mlflow_server(tmp_path) as uri:
        yield uri


def process_group(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return pids
