"""One owner per run dir (apps/rundir.py): a live owner's lock refuses a second claim naming its pid; the kernel
drops it when the owner dies, however it dies, and the dir can be taken over; a forked child does not inherit it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from forge_exp.apps import rundir
from forge_exp.config.validate import ConfigError
from tests.conftest import ROOT

HOLD = ("import sys, time; from forge_exp.apps.rundir import claim; claim(sys.argv[1]); print('held', flush=True); "
        "time.sleep(600)")


def owner(directory) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.fixture(autouse=True)
def _forget_claims(monkeypatch):
    monkeypatch.setattr(rundir, "_HELD", {})


def test_a_live_owner_refuses_a_second_claim_and_a_dead_one_does_not(tmp_path):
    first = owner(tmp_path / "run")
    try:
        with pytest.raises(ConfigError, match=rf"^hydra\.run\.dir={tmp_path}/run is in use by forge-exp pid "
                                              rf"{first.pid} on \S+ \(started .*\); wait for it to end, stop it \(kill "
                                              rf"-TERM {first.pid}\), or give another hydra\.run\.dir$"):
            rundir.claim(str(tmp_path / "run"))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    fd = rundir.claim(str(tmp_path / "run"))  # its lock died with it
    assert rundir.claim(str(tmp_path / "run" / ".." / "run")) == fd and rundir.held() == (fd,)  # once per dir


FORK = ("import os, sys, time; from forge_exp.apps.rundir import claim; claim(sys.argv[1]); child = os.fork()\n"
        "if child == 0:\n    time.sleep(600)\n    os._exit(0)\nprint(child, flush=True); time.sleep(600)")


def test_a_process_forked_by_the_owner_does_not_keep_the_dir_once_the_owner_is_dead(tmp_path):
    """The fork server and the service processes outlive a SIGKILLed controller for a moment: they hold no lock."""
    first = subprocess.Popen([sys.executable, "-c", FORK, str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    child = int(first.stdout.readline())
    try:
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert os.path.exists(f"/proc/{child}")  # the forked child still runs ...
        rundir.claim(str(tmp_path / "run"))  # ... and the dir is free
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_dir_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^checkpoint\.dir=\S+/file/ckpt: cannot write there \(Not a directory\)"):
        rundir.claim(str(tmp_path / "file" / "ckpt"), "checkpoint.dir")
