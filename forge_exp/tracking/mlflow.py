"""MLflow logging for one experiment run: params from the flattened config, batched metrics, artifacts.

Only apps/ and cli.py use this module. Metrics are buffered and sent with `log_batch`: a single `log_metric` call
costs ~20 ms on a sqlite store, which would dominate a fast CPU step.

Everything that talks to the store runs on one background thread, in call order: importing mlflow (~1.2 s) and
opening the store and the run (~1-3 s on a fresh sqlite store) overlap with spawning the services instead of
delaying them (benchmarks/lean.md), and a periodic flush() does not stall the loop. Reading the run's identity
(`run_id`, `experiment_id`) or anything from the store waits for the thread; send()/commit() return once the rows
are stored (checkpoints rely on it); a failure of the thread is raised by the next call to the tracker.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
BATCH = 900  # metrics per log_batch call (MLflow accepts up to 1000)
# MLflow 3's UI opens an experiment on its GenAI pages (traces) unless the experiment says it holds training runs
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store


def default_tracking_uri(root: str | os.PathLike | None = None) -> str:
    """MLFLOW_TRACKING_URI if set, else a sqlite store under ./mlruns of the directory the user ran from."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = Path(root or os.getcwd()) / "mlruns"
    return f"sqlite:///{root.resolve()}/mlflow.db"


def ensure_store(uri: str) -> None:
    """Create a local store once, before any worker logs: several processes creating a fresh sqlite store at once
    corrupt it. Opening the client creates and migrates the tables."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    MlflowClient(uri).search_experiments(max_results=1)


def _artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "artifacts").resolve().as_uri()
    return None


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists keep their index as a key part."""
    out: dict[str, Any] = {}
    items = d.items() if isinstance(d, Mapping) else enumerate(d)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, (Mapping, list, tuple)) and len(v) > 0:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker:
    """One MLflow run. Use as a context manager so the run is marked FAILED/KILLED when the app raises."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        hold: bool = False,
    ):
        """Returns at once; the store and the run are opened on the tracker's thread (see the module docstring).
        hold=True keeps metrics until commit(): with checkpoints, metrics reach MLflow only once the checkpoint
        that covers their steps is on disk, so a resumed run logs no step twice."""
        self.uri = uri
        self.hold = hold
        self._metrics: list[tuple[str, float, int, int]] = []
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-exp-mlflow")
        self._queued: list[Future] = []
        self._opened = self._io.submit(self._open, experiment, run_name, dict(tags or {}), run_id, parent_run_id)

    def _open(self, experiment, run_name, tags, run_id, parent_run_id) -> None:
        from mlflow.entities import RunTag
        from mlflow.tracking import MlflowClient

        ensure_store(self.uri)
        self._client = client = MlflowClient(self.uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            exp_id = client.create_experiment(experiment, artifact_location=_artifact_root(self.uri),
                                              tags=EXPERIMENT_KIND)
        else:
            exp_id = exp.experiment_id
            if not set(EXPERIMENT_KIND.items()) <= set(exp.tags.items()):  # a store made before this tag existed
                for k, v in EXPERIMENT_KIND.items():
                    client.set_experiment_tag(exp_id, k, v)
        self._experiment_id = exp_id
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        if run_id is None:
            run_id = client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
        else:  # resuming: same run, more steps
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        self._run_id = run_id

    # --- the run, once open (these wait for the tracker's thread) --------------------------------------------
    @property
    def client(self):
        self._opened.result()
        return self._client

    @property
    def run_id(self) -> str:
        self._opened.result()
        return self._run_id

    @property
    def experiment_id(self) -> str:
        self._opened.result()
        return self._experiment_id

    def _later(self, fn, *args) -> Future:
        """Queue fn(*args) on the tracker's thread, after everything queued before it."""
        self._raise_failure()
        future = self._io.submit(fn, *args)
        self._queued.append(future)
        return future

    def _now(self, fn, *args):
        return self._later(fn, *args).result()

    def _raise_failure(self) -> None:
        """Raise the error of an earlier queued call that failed (opening the run included); forget those done."""
        if self._opened.done():
            self._opened.result()
        done = [f for f in self._queued if f.done()]
        self._queued = [f for f in self._queued if not f.done()]
        for f in done:
            f.result()

    # --- params / tags -------------------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        self._later(self._log_params, params)

    def _log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self._client.get_run(self._run_id).data.params
        items = [
            Param(k, str(v)[:MAX_PARAM_LEN])
            for k, v in flatten(params).items()
            if k not in existing
        ]
        for i in range(0, len(items), 100):
            self._client.log_batch(self._run_id, params=items[i : i + 100])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if tags:
            self._later(self._set_tags, dict(tags))

    def _set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self._run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    # --- metrics -------------------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffered; sent by flush() (called by the app every few steps and at the end) or, in hold mode, commit()."""
        self._raise_failure()  # a run that could not be opened stops the loop at its next step, not at the end
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            try:
                v = float(v)
            except (TypeError, ValueError):
                continue
            self._metrics.append((k, v, ts, step))
        if len(self._metrics) >= BATCH and not self.hold:
            self.flush()

    def flush(self) -> None:
        """Send the buffered metrics without waiting for the store (hold mode: nothing, commit() sends)."""
        if not self.hold:
            self._later(self._send, self.take_pending())

    def take_pending(self) -> list[tuple[str, float, int, int]]:
        """The buffered metrics as plain (key, value, timestamp, step) rows, removed from the buffer."""
        rows, self._metrics = self._metrics, []
        return rows

    def send(self, rows: list[tuple[str, float, int, int]]) -> None:
        """Store the rows; returns once they are stored."""
        self._now(self._send, list(rows))

    def _send(self, rows: list[tuple[str, float, int, int]]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(*row) for row in rows]
        for i in range(0, len(metrics), BATCH):
            self._client.log_batch(self._run_id, metrics=metrics[i : i + BATCH])

    def commit(self) -> None:
        self.send(self.take_pending())

    def metric_at(self, key: str, step: int) -> float:
        """A logged value (e.g. the start-of-run evaluation, read back when resuming); NaN if absent."""
        history = self._now(lambda: self._client.get_metric_history(self._run_id, key))
        values = [m.value for m in history if m.step == step]
        return values[-1] if values else float("nan")

    # --- artifacts -----------------------------------------------------------------------------------------
    def log_text(self, text: str, path: str) -> None:
        self._later(lambda: self._client.log_text(self._run_id, text, path))

    def log_table(self, columns: Mapping[str, list], path: str) -> None:
        data = dict(columns)
        self._later(lambda: self._client.log_table(self._run_id, data=data, artifact_file=path))

    # --- lifecycle -----------------------------------------------------------------------------------------
    def close(self, status: str = "FINISHED") -> None:
        """Store what is buffered (unless a held run failed), mark the run, and wait for the thread to finish."""
        rows = self.take_pending() if status == "FINISHED" or not self.hold else []
        # held metrics of a failed run are not logged: they would be logged again on resume
        try:
            if self._opened.exception() is None:
                self._later(self._send, rows).result()
                self._later(lambda: self._client.set_terminated(self._run_id, status=status)).result()
            self._raise_failure()
        finally:
            self._io.shutdown(wait=True)

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("FINISHED")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close("KILLED")
        else:
            self.close("FAILED")

    def run_url(self) -> str:
        base = self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else UI
        return f"{base}/#/experiments/{self.experiment_id}/runs/{self.run_id}?workflowType=machine_learning"


def ui_command(uri: str) -> str:
    """The command that opens the UI on `uri`, runnable from where the user stands: the `mlflow` of this
    interpreter's environment when `mlflow` is not on PATH (a venv that is not activated)."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    exe = Path(sys.executable).parent / "mlflow"
    if shutil.which("mlflow") and Path(shutil.which("mlflow")).resolve() == exe.resolve():
        mlflow = "mlflow"
    elif exe.exists():
        mlflow = os.path.relpath(exe) if not os.path.relpath(exe).startswith("../..") else str(exe)
    else:
        mlflow = f"{sys.executable} -m mlflow"
    return f"{mlflow} ui --backend-store-uri {uri}"
