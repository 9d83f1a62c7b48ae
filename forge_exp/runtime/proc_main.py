"""The entry point of every service process: Monarch's own bootstrap, with the stop signals ignored.

A stop signal is the controller's to act on: it lets the step in flight finish, checkpoints, and then stops the
meshes (apps/faults.py). SLURM sends SIGTERM to every process of a job (scancel, a time limit), so a service that
died of it would take that step with it. SIGKILL still ends a service process, and so does its controller's death
(Monarch starts it with a parent-death signal); stopping a mesh does not use signals.
"""

import runpy
import signal

if __name__ == "__main__":
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)  # (SIGINT ignored: asyncio then installs no Ctrl-C handler either)
    runpy.run_module("monarch._src.actor.bootstrap_main", run_name="__main__", alter_sys=True)
