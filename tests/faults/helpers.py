"""Running the real `forge-exp` for the fault tests: every process it ever had is watched, a service's process is
found by the name Monarch gives it (HYPERACTOR_PROCESS_NAME=<mesh>-<rank>), and what MLflow holds is read back."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from forge_exp.tracking.store import migrated, sqlite_path
from tests.conftest import ROOT

FAST = ["dataset.eval_size=16", "progress=false"]  # the default experiment, with a small held-out set


def cli(tmp_path: Path, cache: Path, *args: str, run: str = "run", uri: str | None = None) -> list[str]:
    return [sys.executable, "-m", "forge_exp.cli", *FAST, *args, f"hydra.run.dir={tmp_path / run}",
            f"tracking.uri={uri or f'sqlite:///{tmp_path}/mlflow.db'}", f"model.warmstart.cache_dir={cache}"]


class Run:
    """One `forge-exp` process and every descendant it ever had. Its output is read as it comes (a pipe nobody reads
    blocks the writer once ~64 KiB are waiting: a run must never stall on its own stderr while the test waits)."""

    started: list["Run"] = []  # every Run of the test, stopped after it (tests/faults/conftest.py)

    def __init__(self, cmd: list[str], cwd: Path = ROOT):
        Run.started.append(self)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}  # service processes import tests.faults.bad
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.seen: set[int] = set()
        self._chunks: dict[str, list[str]] = {"out": [], "err": []}
        self._readers = [threading.Thread(target=self._read, args=(stream, self._chunks[name]), daemon=True)
                         for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        into.extend(stream)  # line by line, as they come

    @property
    def out(self) -> str:
        return "".join(self._chunks["out"])

    @property
    def err(self) -> str:
        return "".join(self._chunks["err"])

    def children(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.seen |= {k.pid for k in kids}
        return kids

    def service(self, mesh: str, timeout: float = 300) -> psutil.Process:
        """The process of proc mesh `mesh` (rank 0), once it exists."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.finish(0)[2][-3000:]
            for k in self.children():
                try:
                    if k.environ().get("HYPERACTOR_PROCESS_NAME", "").startswith(f"{mesh}-0"):
                        return k
                except psutil.Error:
                    continue
            time.sleep(0.2)
        raise AssertionError(f"no process for mesh {mesh} within {timeout} s")

    def wait_for(self, path: Path, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while not path.exists():
            self.children()
            assert self.proc.poll() is None, f"ended before {path}: " + self.finish(0)[2][-3000:]
            assert time.time() < deadline, f"no {path} within {timeout} s"
            time.sleep(0.1)

    def signal(self, signum: int) -> float:
        self.children()
        self.proc.send_signal(signum)
        return time.monotonic()

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        end = time.time() + timeout
        while self.proc.poll() is None and time.time() < end:
            self.children()
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for reader in self._readers:  # to the end of both streams (a descendant still holding them: not forever)
            reader.join(timeout=30)
        return self.proc.returncode, self.out, self.err

    def stop(self) -> None:
        """Kill it and its descendants if it still runs (a test that failed before it waited for the end). Only the
        live tree: a pid seen earlier may belong to another process by now."""
        if self.proc.poll() is None:
            for p in [*self.children(), self.proc]:
                with contextlib.suppress(ProcessLookupError, psutil.Error):
                    p.kill()
        self.finish(0)

    def orphans(self, wait: float = 5.0) -> list[int]:
        """Descendants still alive `wait` seconds after the run ended."""
        deadline = time.time() + wait
        while True:
            alive = [p for p in self.seen if _alive(p)]
            if not alive or time.time() > deadline:
                return alive
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def the_run(uri: str):
    """(client, the one run of the store). ValueError while a local store is not yet there: the run creates it
    under its lock (tracking/store.py ensure_store), and a client opening it meanwhile would race that creation."""
    path = sqlite_path(uri)
    if path is not None and not migrated(path):
        raise ValueError(f"no store at {path} yet")
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return client, run


def steps(client, run_id: str, key: str = "loss/total") -> list[int]:
    """Every step logged under key, in order, duplicates kept (a duplicated step shows twice)."""
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def trained(cache: Path) -> Path:
    """The default experiment's warm start in the session's cache (the first run of a session trains it), trained
    here when no run has yet: a valid HF model directory for the rows that need one."""
    from forge_exp.apps.common import WarmStart
    from tests.config.helpers import typed

    model = cache / WarmStart.of(typed()).dir.name  # the default's key (the session's cache holds other runs' too)
    if not (model / "config.json").exists():
        where = Path(tempfile.mkdtemp(prefix="forge-exp-warm-"))
        rc, _, err = Run(cli(where, cache, "steps=1")).finish(600)
        shutil.rmtree(where, ignore_errors=True)
        assert rc == 0, err[-3000:]
    assert (model / "config.json").exists(), f"no warm start at {model}"
    return model


def resume_to_the_end(cmd: list[str], uri: str, total: int):
    """`cmd resume=true` finishes the run: FINISHED, every step 1..total logged once, nothing left behind."""
    again = Run([*cmd, "resume=true"])
    rc, _, err = again.finish(300)
    assert rc == 0, err[-3000:]
    client, r = the_run(uri)
    assert r.info.status == "FINISHED"
    for key in ("loss/total", "reward/mean", "train/version"):
        assert steps(client, r.info.run_id, key) == list(range(1, total + 1)), key
    assert again.orphans() == []
    return client, r


class Mounts:
    """A private mount namespace (as root) with its own mounts (a small tmpfs, a read-only bind), held by one
    `sleep` until the test is done: commands enter it with nsenter, so the disk can be filled, grown or read while a
    run works on it, and nothing outside sees the mounts. Unmounted when its holder ends."""

    def __init__(self, *mounts: str):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs or a read-only bind needs root (CI runs as root)")
        script = " && ".join([*mounts, "echo ready", "exec sleep 3600"])
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.holder.stdout.readline().strip() == "ready", self.holder.communicate()[1]

    def enter(self, cmd: list[str]) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", *cmd]

    def sh(self, script: str) -> str:
        return subprocess.run(self.enter(["sh", "-c", script]), capture_output=True, text=True, check=True,
                              timeout=120).stdout

    def __enter__(self) -> "Mounts":
        return self

    def __exit__(self, *exc) -> None:
        self.holder.kill()
        self.holder.wait()


def kill_all(run: Run, signum: int) -> None:
    """What SLURM does at scancel or a time limit: the signal to every process of the job at once."""
    for p in [run.proc.pid, *(k.pid for k in run.children())]:
        try:
            os.kill(p, signum)
        except ProcessLookupError:
            pass


__all__ = ["Mounts", "Run", "cli", "kill_all", "last_line", "signal", "steps", "the_run", "trained"]
