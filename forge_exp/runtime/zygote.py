"""Procs forked from a pre-imported parent: the controller starts one fork server (runtime/zygote_server.py) once
the run's input has passed its checks (no process starts for a bad input). Where the controller is still safe to
fork then (one thread, no Monarch, no CUDA, no file of its own open: `Forked`), the server is forked from it and
keeps the torch and transformers modules the checks imported, sharing their pages; otherwise it is a fresh
interpreter that imports them itself. Either way its imports of the rest overlap the controller's own start of the tracker and the mesh;
a proc Monarch starts then runs the tiny client (runtime/zygote_client.py) instead of a fresh interpreter that
imports everything again. Each heavy proc saved ~3.5 s of CPU at start-up and shares the imported modules' pages
with its siblings (benchmarks/lean.md has the numbers).

Where: procs of this host with no GPU (`bootstrap_command(plan)`); GPU procs and procs on cluster nodes keep the
plain bootstrap (runtime/bootstrap.py). The server never initialises CUDA, so GPU procs could be forked too, but
that is not measured or tested yet. `FORGE_EXP_FORK_SERVER=0` turns it off.

If the server cannot start or dies, procs start with the plain bootstrap (logged once here; a client that finds no
server becomes the plain bootstrap itself). The server ends with the controller: `stop()` closes its stdin, and
its stdin also closes when the controller dies in any way; it has a parent-death signal as well.

    zygote.start()                      # cli.run, after the input checks, before the tracker and the mesh
    zygote.bootstrap_command(plan)      # runtime/services.py: what Monarch runs for a local mesh's procs
    zygote.stop()                       # at the end of the command (also on failure: atexit)
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from forge_exp.runtime.bootstrap import bootstrap_command as plain_bootstrap_command

if TYPE_CHECKING:
    from forge_exp.runtime.layout import MeshPlan

ENV = "FORGE_EXP_FORK_SERVER"
CLIENT = str(Path(__file__).with_name("zygote_client.py"))
log = logging.getLogger(__name__)
_server: "subprocess.Popen | Forked | None" = None
_name = ""
_warned = False


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def start(own: tuple[int, ...] = ()) -> bool:
    """Start the fork server (once per process); False where it is off or could not start (procs then start plain).
    `own`: descriptors this process holds that the forked server closes (as it closes every other one).

    Forked from this process when that is safe (one thread, no Monarch, no CUDA, no file it opened itself other than
    its log file: so before the tracker and the mesh), which keeps the torch and transformers modules the input checks imported: the server then imports only
    the rest (forge_exp's modules, the tiny model's modeling code among them), and shares its pages with this
    process. Otherwise a fresh interpreter that imports everything."""
    global _server, _name
    if _server is not None or not enabled():
        return _server is not None
    _name = f"forge-exp-zygote-{os.getpid()}-{secrets.token_hex(6)}"
    from forge_exp.runtime.zygote_server import fork_safe

    try:
        if why := fork_safe(own):
            log.debug("the fork server starts in a fresh interpreter: this process is not safe to fork (%s)", why)
            # own session: a Ctrl-C at the terminal is the controller's to act on, not the server's
            _server = subprocess.Popen([sys.executable, "-m", "forge_exp.runtime.zygote_server", _name],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
        else:
            _server = Forked(_name)
    except OSError as e:
        _warn(f"it could not start ({e})")
        return False
    atexit.register(stop)
    return True


class Forked:
    """The fork server as a child forked from this process, with what the rest of this module uses of a Popen."""

    NAME = b"forge-exp-fork"  # its process name (ps, psutil): its command line is this process's

    def __init__(self, name: str):
        r, w = os.pipe()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(w)
                self._become_server(r, name)
            finally:
                os._exit(1)
        os.close(r)
        self.stdin = os.fdopen(w, "wb", buffering=0)

    @classmethod
    def _become_server(cls, stdin: int, name: str) -> None:
        """In the child: leave this process's state behind as a fresh interpreter would not have it, then serve."""
        import ctypes

        from forge_exp.runtime import zygote_server

        os.setsid()  # own session, as the plain server's
        ctypes.CDLL(None).prctl(zygote_server.PR_SET_NAME, ctypes.c_char_p(cls.NAME), 0, 0, 0)
        # The exit hooks stay: registered before this point only by the libraries imported (the CLI registers its own
        # later), they are what a fresh interpreter importing them would have; multiprocessing's, for one, ends a
        # proc's daemonic children (vLLM's engine core) when the proc exits.
        for logger in [logging.root, *logging.Logger.manager.loggerDict.values()]:  # Hydra's handlers, levels
            if isinstance(logger, logging.Logger):
                for handler in list(logger.handlers):
                    logger.removeHandler(handler)
                    handler.close()
                logger.setLevel(logging.WARNING if logger is logging.root else logging.NOTSET)
        os.dup2(stdin, 0)  # the controller's end of this pipe closes when it stops the server or dies
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # stdin, stdout and the controller's stderr: as Popen passes
        zygote_server.run(name)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (a waitpid(-1) in this process): gone, code unknown
                self.returncode = 0  # as Popen does then
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("fork server", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def running() -> bool:
    return _server is not None and _server.poll() is None


def forks(plan: "MeshPlan") -> bool:
    """Whether the mesh's procs may be forked: local CPU procs (GPU and cluster procs: see the module docstring)."""
    return not (plan.gpus or plan.nodes)


def bootstrap_command(plan: "MeshPlan | None" = None):
    """What Monarch runs to start a proc: the fork client where this run's server can fork it, else the plain one."""
    cmd = plain_bootstrap_command()
    if plan is not None and not forks(plan):
        return cmd
    if not running():
        if _server is not None:
            _warn(f"it exited with code {_server.returncode}")
        return cmd
    cmd.args = [CLIENT, _name]
    return cmd


def stop() -> None:
    """End the server (its procs are stopped by then; any it still has are killed with it)."""
    global _server
    server, _server = _server, None
    if server is None:
        return
    try:
        server.stdin.close()  # what a server in its loop exits on
    except OSError:
        pass
    try:
        server.wait(timeout=0.5)
    except subprocess.TimeoutExpired:  # still importing (an early config error): nothing of its is needed
        server.kill()
        server.wait()


def _warn(why: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("the fork server is unavailable: %s; procs start with the plain bootstrap (%s=0 turns it off)",
                    why, ENV)
