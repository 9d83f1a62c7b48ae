"""The loggers beside MLflow (`logger=[mlflow,tensorboard,wandb]`, config/logger.py): a small fan-out that the
tracker (tracking/mlflow.py) feeds, on its own thread, exactly what it hands MLflow.

- metrics: the rows on their way to MLflow, at their steps, after the tracker's own filtering (hold mode sends
  them once their checkpoint is on disk; a resume does not send steps MLflow has already) — so each logger has the
  values MLflow has, at the same steps;
- params: the flattened config; text: the resolved config (`config/resolved.yaml`) and other text artifacts;
- close(status): every exit of the tracker, FINISHED, FAILED or KILLED.

Each logger imports its library only when the run opens (tensorboard ~1 s, wandb ~1 s and a `wandb-core`
process), so the default run, with MLflow alone, pays nothing. MLflow stays the record: a logger that fails is
named once on stderr and dropped, and the run goes on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import Any, Mapping

from forge_exp.tracking.store import briefly

STEP_KEY = "step"  # wandb: each row carries the run's step under this key, the x-axis of every chart


def _needs(package: str):
    """A logger's check_installed (apps/preflight.py calls it before anything starts): a one-line ImportError that
    names the extra, without importing the library."""
    def check_installed() -> None:
        if importlib.util.find_spec(package) is None:
            raise ImportError(f"logger={package} needs the {package} package: pip install 'forge-exp[{package}]'")
    return staticmethod(check_installed)


class TensorBoard:
    """Event files for `tensorboard --logdir <log_dir>` through torch's SummaryWriter."""

    check_installed = _needs("tensorboard")

    def __init__(self, run_dir: str, log_dir: str | None = None, flush_secs: int = 30):
        self.log_dir = log_dir or os.path.join(run_dir, "tensorboard")
        self.flush_secs = flush_secs
        self.writer = None

    def open(self, run_id: str, run_name: str, experiment: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.log_dir, flush_secs=self.flush_secs)
        self.writer.add_text("mlflow", f"experiment {experiment}, run {run_name} ({run_id})")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_params(self, params: Mapping[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("params", f"| param | value |\n| --- | --- |\n{rows}")

    def log_text(self, text: str, path: str) -> None:
        self.writer.add_text(path, "\n".join("    " + line for line in text.splitlines()))  # markdown: verbatim

    def close(self, status: str) -> None:
        self.writer.add_text("status", status)
        self.writer.close()


class Wandb:
    """A Weights & Biases run, always offline: `<dir>/wandb/offline-run-<time>-<MLflow run id>/`, uploaded later
    with `wandb sync`. A resumed run writes a new offline run with the same id, which `wandb sync` joins."""

    check_installed = _needs("wandb")

    def __init__(self, run_dir: str, project: str | None = None, dir: str | None = None):
        self.dir = dir or run_dir
        self.project = project
        self.run = None

    def open(self, run_id: str, run_name: str, experiment: str) -> None:
        import wandb

        os.makedirs(self.dir, exist_ok=True)
        # no system metrics, git, code or pip-freeze capture: the 2-core default run cannot spare the CPU, and
        # MLflow has the commit
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True,
                                  disable_git=True, save_code=False, x_save_requirements=False)
        self.run = wandb.init(mode="offline", dir=self.dir, project=self.project or experiment, id=run_id,
                              name=run_name, settings=settings)
        # steps may repeat or go back (the summary at the last step, a resume): wandb's own _step may not, so the
        # run's step is a column of its own and every chart's x-axis
        self.run.define_metric("*", step_metric=STEP_KEY)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({**metrics, STEP_KEY: step})

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log_text(self, text: str, path: str) -> None:
        target = os.path.join(self.run.dir, path)  # the run's files, uploaded by `wandb sync`
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(text)

    def close(self, status: str) -> None:
        import wandb

        try:
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        finally:
            wandb.teardown()  # stops the wandb-core process (the CLI ends without running atexit hooks)


class Loggers:
    """The run's loggers besides MLflow, by name (`logger.<name>`), opened with the MLflow run."""

    def __init__(self, loggers: Mapping[str, Any] | None = None):
        self.waiting = dict(loggers or {})
        self.open: dict[str, Any] = {}

    def start(self, run_id: str, run_name: str, experiment: str) -> None:
        waiting, self.waiting = self.waiting, {}
        for name, logger in waiting.items():
            if self._try(name, "open", lambda: logger.open(run_id, run_name, experiment), logger):
                self.open[name] = logger

    def metrics(self, rows: list[tuple[str, float, int, int]]) -> None:
        """(key, value, timestamp ms, step) rows, as the tracker sends them to MLflow."""
        if not self.open or not rows:
            return
        steps: dict[int, dict[str, float]] = {}
        for key, value, _, step in rows:
            steps.setdefault(step, {})[key] = value
        self._each("log metrics", lambda lg: [lg.log_metrics(m, step) for step, m in steps.items()])

    def params(self, params: Mapping[str, Any]) -> None:
        self._each("log params", lambda lg: lg.log_params(params))

    def text(self, text: str, path: str) -> None:
        self._each(f"log {path}", lambda lg: lg.log_text(text, path))

    def close(self, status: str) -> None:
        opened, self.open, self.waiting = self.open, {}, {}
        for name, logger in opened.items():
            self._try(name, "close", lambda lg=logger: lg.close(status))

    def _each(self, what: str, call) -> None:
        for name, logger in list(self.open.items()):
            if not self._try(name, what, lambda: call(logger), logger):
                del self.open[name]

    @staticmethod
    def _try(name: str, what: str, call, dropped=None) -> bool:
        """call(); a failure is one line on stderr, and the logger (if given) is closed and logs nothing more."""
        try:
            call()
            return True
        except Exception as e:  # noqa: BLE001 — MLflow has the run; this logger's library failed
            more = "; it logs nothing more in this run (MLflow has everything)" if dropped is not None else ""
            print(f"forge-exp: warning: logger.{name} could not {what} ({briefly(e)}){more}", file=sys.stderr,
                  flush=True)
            if dropped is not None:
                with contextlib.suppress(Exception):
                    dropped.close("FAILED")
            return False
