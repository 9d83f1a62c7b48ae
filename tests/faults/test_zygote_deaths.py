"""The default run forks its trainer and generator from the fork server (runtime/zygote.py): kill -9 of the forked
process itself (not the client Monarch started) fails the run within seconds as any service death does, and no
process of the run, the server included, is left after a run that failed or finished."""

from __future__ import annotations

import time

import psutil

from forge_exp.runtime.zygote import Forked
from tests.faults.helpers import Run, cli, last_line, the_run


def the_server(run: Run, timeout: float = 120) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for k in run.children():
            try:
                if k.name() == Forked.NAME.decode():  # forked from the controller (its command line is the run's)
                    return k
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError("no fork server among the run's processes")


def forked(server: psutil.Process, name: str, timeout: float = 300) -> psutil.Process:
    """The server's child that is proc `name` (its process name is the proc's, e.g. generator-0)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for k in server.children():
            try:
                if k.name() == name:
                    return k
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no forked {name} within {timeout} s")


def test_kill_9_of_a_forked_service_fails_the_run_and_leaves_nothing(tmp_path, warmstart_cache):
    run = Run(cli(tmp_path, warmstart_cache, "steps=16", "checkpoint.every=2"))
    server = the_server(run)
    run.wait_for(tmp_path / "run" / "checkpoints" / "step_0000002" / "metrics_flushed")
    victim = forked(server, "generator-0")
    t0 = time.monotonic()
    victim.kill()
    rc, _, err = run.finish(120)
    seconds = time.monotonic() - t0
    assert rc == 1, err[-3000:]
    assert last_line(err) == "forge-exp: error: generator (replica 0) died: SIGKILL"
    print(f"forked generator: {seconds:.1f} s from the kill to the controller's exit")
    assert seconds < 20
    assert server.pid in run.seen and run.orphans() == [], "processes left behind"
    _, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FAILED"


def test_a_finished_run_forks_its_procs_and_leaves_no_server(tmp_path, warmstart_cache):
    run = Run(cli(tmp_path, warmstart_cache, "steps=3"))
    server = the_server(run)
    trainer = forked(server, "trainer-0")
    rc, _, err = run.finish(300)
    assert rc == 0, err[-3000:]
    assert trainer.pid in run.seen and server.pid in run.seen
    assert run.orphans() == [], "processes left behind"
