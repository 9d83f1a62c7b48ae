"""How a run ends when it does not finish: stop signals, a reward that keeps failing, and the exit codes.

    what happens                                 MLflow status        exit code   last line on stderr
    finished                                     FINISHED             0
    a mistake in the config or the inputs        (no run)             2           forge-exp: error: <key or file>: ...
    a service died or raised (supervision.py)    FAILED               1           forge-exp: error: <service> (replica r) died: SIGKILL
    a reward function failing too often          FAILED               1           forge-exp: error: reward.functions.<name> ...
    SIGTERM (scancel, SLURM time limit)          KILLED               143         forge-exp: stopped by SIGTERM ...
    SIGUSR2 (sbatch --signal=USR2@<s>: notice)   KILLED (preempted)   140         forge-exp: stopped by SIGUSR2 ...
    Ctrl-C (SIGINT)                              KILLED               130         forge-exp: stopped by SIGINT ...

A stop signal lets the step in flight finish (for up to checkpoint.stop_grace_s), checkpoints it when checkpoints
are on, and ends the run; a resumed run (resume=true in the same run dir) continues from there. A second Ctrl-C
stops at once, and so does a signal before the loop's first step (building the services: nothing to keep yet) or in
a loop that does not check for it (SFT, eval). docs/reliability.md lists every fault, what the platform promises and the test that shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass, field

EXIT_FAILED = 1
EXIT_CONFIG = 2
STOP_SIGNALS = {signal.SIGTERM: 143, signal.SIGUSR2: 140, signal.SIGINT: 130}  # 128 + the signal's number
NOT_STARTED = "the run had not started its steps"


class Stopped(Exception):
    """The run ended on a stop signal: KILLED in MLflow; `str()` is the CLI's last line."""

    run_status = "KILLED"

    def __init__(self, signum: int, step: int | None, checkpoint: str | None, why: str = "",
                 newest: str | None = None):
        """`checkpoint`: the one written at the stop; `newest`: when none was, the newest one already there."""
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        resume = "continue it with resume=true in the same run dir"
        if checkpoint:
            where = f"after step {step}; checkpoint {checkpoint} ({resume})"
        elif step is not None:
            where = f"after step {step}, with no checkpoint ({why or 'checkpoint.every=0'})"
        elif why == NOT_STARTED:
            where = f"before its first step ({why})"
        elif newest:
            where = (f"during a step ({why or 'the step did not end in time'}); the newest checkpoint is {newest} "
                     f"({resume})")
        else:
            where = f"during a step, with no checkpoint ({why or 'the step did not end in time'})"
        super().__init__(f"stopped by {name}{' (preempted)' if signum == signal.SIGUSR2 else ''} {where}")

    @property
    def exit_code(self) -> int:
        return STOP_SIGNALS.get(self.signum, EXIT_FAILED)


class RunFailed(RuntimeError):
    """The loop decided the run cannot go on (a reward function that keeps failing): FAILED, exit 1."""

    run_status = "FAILED"


@dataclass
class StopRequest:
    """The stop signals, while a run's event loop is up. `requested` is the signal the loop should stop for (the
    loop checks it between steps); if the loop has not stopped `grace_s` after it, the run's task is cancelled."""

    signum: int | None = None
    steps_started: bool = False  # set by a loop that checks `requested` between steps; before that, stop at once
    again: int | None = None  # a second stop signal, which stopped the run at once
    _task: asyncio.Task | None = None
    _grace: asyncio.TimerHandle | None = None
    _installed: dict[int, object] = field(default_factory=dict)  # signal → the Python handler it had before

    @property
    def requested(self) -> int | None:
        return self.signum

    def install(self, grace_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.signum, self.steps_started, self.again = None, False, None
        for signum in STOP_SIGNALS:
            self._installed[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, self._on_signal, signum, grace_s)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for signum, before in self._installed.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, before)
        self._installed.clear()
        if self._grace is not None:
            self._grace.cancel()
        self._task = None

    def _on_signal(self, signum: int, grace_s: float) -> None:
        if self.signum is not None:  # a second signal (Ctrl-C twice): now
            self.again = signum
            print(f"forge-exp: {signal.Signals(signum).name} again: stopping now", file=sys.stderr, flush=True)
            self.force()
            return
        self.signum = signum
        if not self.steps_started:  # starting up or no step loop (SFT, eval): nothing to finish first
            self.force()
            return
        print(f"forge-exp: {signal.Signals(signum).name}: stopping after the step in flight (at most {grace_s:.0f} s)"
              f"{'; Ctrl-C again to stop now' if signum == signal.SIGINT else ''}", file=sys.stderr, flush=True)
        self._grace = asyncio.get_running_loop().call_later(grace_s, self.force)

    def force(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


STOP = StopRequest()  # signals are per process, and so is this


@contextlib.contextmanager
def stop_signals():
    """Outside the run's event loop (starting up, closing the MLflow run), SIGTERM and SIGUSR2 raise Stopped like
    Ctrl-C raises KeyboardInterrupt, so the run is marked KILLED instead of left RUNNING by a process that vanished."""

    def raise_stopped(signum, frame):
        raise Stopped(signum, None, None, NOT_STARTED)

    previous = {s: signal.signal(s, raise_stopped) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class RewardWatch:
    """Stops a run whose reward function fails on more than `max_rate` of a step's completions, `steps` steps in a
    row: its scores are then `reward.failure_value`, and a run that "finishes" on them has learned nothing."""

    def __init__(self, max_rate: float, steps: int):
        self.max_rate, self.steps = max_rate, steps
        self.streak: dict[str, int] = {}

    def update(self, metrics: dict[str, float]) -> tuple[str, float] | None:
        """A step's metrics (`reward/failed/<name>`: that function's failure share) → (name, share) once one has
        been over the limit for `steps` steps in a row, else None."""
        if self.max_rate >= 1:
            return None
        worst = None
        for key, share in metrics.items():
            if not key.startswith("reward/failed/"):
                continue
            name = key[len("reward/failed/"):]
            self.streak[name] = self.streak.get(name, 0) + 1 if share > self.max_rate else 0
            if self.streak[name] >= self.steps and (worst is None or share > worst[1]):
                worst = (name, share)
        return worst

    def error(self, name: str, share: float, cause: str | None) -> RunFailed:
        return RunFailed(
            f"reward.functions.{name} failed on {share:.0%} of the completions for {self.steps} steps in a row "
            f"(reward.max_failure_rate={self.max_rate}): {cause or 'no error recorded'}"
        )
