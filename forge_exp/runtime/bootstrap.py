"""How the processes of a run start and end: Monarch's own proc bootstrap with the stop signals ignored, then an exit
that skips freeing the interpreter.

A stop signal is the controller's to act on: it lets the step in flight finish, checkpoints, and then stops the
meshes (driver/faults.py). SLURM sends SIGTERM to every process of a job (scancel, a time limit), so a service that
died of it would take that step with it. SIGKILL still ends a service process, and so does its controller's death
(Monarch starts it with a parent-death signal); stopping a mesh does not use signals.

A process that has imported torch and transformers spends 1-2 s (more when the cores are busy) in interpreter
finalization after its work is done, freeing thousands of modules one by one; `Runtime.stop` waits for every proc
to exit, and the user waits for the controller. Nothing a run needs happens there, so both end with `fast_exit`:
the atexit hooks run (logging, a sweep's parent run), the standard streams are flushed, then `os._exit`.
benchmarks/lean.md has the measurements.

    python -m forge_exp.runtime.bootstrap   # what runtime/services.py has Monarch start for each proc
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

BOOTSTRAP_MODULE = "forge_exp.runtime.bootstrap"


def fast_exit(code: int = 0) -> None:
    """Run the atexit hooks, flush stdout/stderr and leave without finalizing the interpreter."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken pipe: nothing more to write
                pass
        os._exit(code)


def bootstrap_command():
    """Monarch's default proc command (this interpreter, its environment) with this module as the entry point."""
    from monarch._src.actor.host_mesh import default_bootstrap_cmd

    cmd = default_bootstrap_cmd()
    cmd.args = ["-m", BOOTSTRAP_MODULE]
    return cmd


def main() -> None:
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)  # (SIGINT ignored: asyncio then installs no Ctrl-C handler either)
    from monarch._src.actor.bootstrap_main import invoke_main

    try:
        invoke_main()  # returns through SystemExit once Monarch has stopped this proc's actors
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        fast_exit(code)
    fast_exit(0)


if __name__ == "__main__":
    main()
