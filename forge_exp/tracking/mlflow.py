"""MLflow logging for one experiment run: params from the flattened config, batched metrics, artifacts.

Only apps/ and cli.py use this module. Metrics are buffered and sent with `log_batch`: a single `log_metric` call
costs ~20 ms on a sqlite store, which would dominate a fast CPU step. A batch the store refuses or does not answer
(a server restarting) is kept, on disk when the run has a directory, and sent again on the next flush; the run goes
on. tracking/store.py creates the store, probes it, and closes what a dead controller left RUNNING.

Everything that talks to the store runs on one background thread, in call order, and a periodic flush() does not
stall the loop. Importing mlflow (~1.2 s) and opening the store and the run (~1-3 s on a fresh sqlite store) wait for
`begin()`, which the app calls once its processes are up and its first step is under way: on a 2-core machine that
CPU would otherwise be taken from starting them (benchmarks/lean.md). Reading the run's identity (`run_id`,
`experiment_id`) or anything from the store begins and waits for the thread; send()/commit() return once the rows
are stored (checkpoints rely on it); a failure of the thread is raised by the next call to the tracker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

from forge_exp.tracking.loggers import Loggers
from forge_exp.tracking.store import (  # noqa: F401 — ensure_store, ui_command: for the sweep callback and the CLI
    SPOOL_FILE, Ownership, TrackingRefused, briefly, create_experiment, ensure_store, last_logged_step,
    quiet_store_errors, read_spool, send_rows, store_lock, store_log_note, ui_command, wait_for, write_spool,
)

log = logging.getLogger(__name__)
MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
BATCH = 900  # metrics per log_batch call (MLflow accepts up to 1000)
# MLflow 3's UI opens an experiment on its GenAI pages (traces) unless the experiment says it holds training runs
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store
RETRY_S = (5, 10, 30, 60)  # after a failed send, wait this long (then the next) before trying again
CLOSE_WAIT_S = 60.0  # at the end, how long to keep trying to reach the store before leaving it to the next start


def default_tracking_uri(root: str | os.PathLike | None = None) -> str:
    """MLFLOW_TRACKING_URI if set, else a sqlite store under ./mlruns of the directory the user ran from."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = Path(root or os.getcwd()) / "mlruns"
    return f"sqlite:///{root.resolve()}/mlflow.db"


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
    """One MLflow run. Use as a context manager so the run is marked FAILED/KILLED when the app raises (an
    exception may say which with a `run_status` attribute, and `str()` of it is kept in the tag forge_exp.error)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        resume_step: int | None = None,
        hold: bool = False,
        run_dir: str | os.PathLike | None = None,
        close_wait_s: float = CLOSE_WAIT_S,
        loggers: Mapping[str, Any] | None = None,
    ):
        """Returns at once; the store and the run are opened on the tracker's thread once begin() is called (see the
        module docstring). hold=True keeps metrics until commit(): with checkpoints, metrics reach MLflow only once
        the checkpoint that covers their steps is on disk, so a resumed run logs no step twice. `run_dir`: where the
        run claims its MLflow run (tracking/store.py: Ownership) and keeps metrics the store did not take.
        `resume_step`: the checkpoint a resumed run (run_id) continues from; steps after it that the run had logged
        already (its newer checkpoint was damaged or removed) are trained again but not logged again. `loggers`: the
        others the run logs to ({name: logger}, tracking/loggers.py), fed what MLflow is fed, closed with the run."""
        self.uri = uri
        self.hold = hold
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.owner = Ownership(run_dir) if run_dir is not None else None
        self.spool: Path | None = None  # set once the run id is known
        self._unsent: list[tuple] = []  # rows the store did not take (only the tracker's thread touches them)
        self.resume_step, self._logged = resume_step, (0, 0)  # steps (after, through] MLflow has: not sent again
        self._retry_at, self._failures = 0.0, 0
        self.close_wait_s = close_wait_s
        self.loggers = Loggers(loggers)
        self._metrics: list[tuple[str, float, int, int]] = []
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-exp-mlflow")
        self._queued: list[Future] = []
        self._begun = threading.Event()
        self._opened = self._io.submit(self._open, experiment, run_name, dict(tags or {}), run_id, parent_run_id)

    def begin(self) -> None:
        """Open the store and the run now (queued calls follow). Called by the app once its first step is under way,
        and by everything that waits for the store; returns at once."""
        self._begun.set()

    def _open(self, experiment, run_name, tags, run_id, parent_run_id) -> None:
        self._begun.wait()
        try:
            self._open_run(experiment, run_name, tags, run_id, parent_run_id)
        except Exception as e:  # noqa: BLE001 — MLflow's own exception types vary by store; one line for all
            why = (str(e).strip().splitlines() or [""])[0][:300]
            raise TrackingRefused(f"tracking.uri={self.uri}: MLflow did not open the run of experiment "
                                  f"{experiment!r} ({type(e).__name__}: {why})") from e

    def _open_run(self, experiment, run_name, tags, run_id, parent_run_id) -> None:
        from mlflow.entities import RunTag
        from mlflow.tracking import MlflowClient

        quiet_store_errors(self.run_dir)
        ensure_store(self.uri)
        self._client = client = MlflowClient(self.uri)
        with store_lock(self.uri):  # several runs starting at once on a new store: one creates the experiment
            exp_id = create_experiment(client, experiment, artifact_location=_artifact_root(self.uri),
                                       tags=EXPERIMENT_KIND)
        exp = client.get_experiment(exp_id)
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
            self._rewind(run_id)
        self._run_id = run_id
        self.loggers.start(run_id, run_name or run_id, experiment)
        if self.run_dir is not None:
            self.spool = self.run_dir / SPOOL_FILE.format(run_id=run_id)
            self._unsent = read_spool(self.spool)
            self.owner.claim(self.uri, run_id)

    def _rewind(self, run_id: str) -> None:
        """A resume from an older checkpoint than the run's newest logged step: MLflow keeps the first values of the
        steps in between (it cannot delete points), the run is tagged so, and they are not sent again."""
        if self.resume_step is None:
            return
        logged = last_logged_step(self._client, run_id)
        if logged <= self.resume_step:
            return
        self._logged = (self.resume_step, logged)
        steps = f"steps {self.resume_step + 1}-{logged}"
        self._client.set_tag(run_id, "forge_exp.rewound", f"{steps} were trained again from the checkpoint of step "
                                                          f"{self.resume_step}; MLflow keeps their first values")
        print(f"forge-exp: warning: MLflow run {run_id} has {steps} already (a newer checkpoint was damaged or "
              f"removed); they are trained again from step {self.resume_step} and not logged twice (tag "
              f"forge_exp.rewound)", file=sys.stderr, flush=True)

    def _not_logged(self, rows: list[tuple]) -> list[tuple]:
        after, through = self._logged
        return [r for r in rows if not after < r[3] <= through]

    # --- the run, once open (these wait for the tracker's thread) --------------------------------------------
    @property
    def client(self):
        self._wait_open()
        return self._client

    @property
    def run_id(self) -> str:
        self._wait_open()
        return self._run_id

    @property
    def experiment_id(self) -> str:
        self._wait_open()
        return self._experiment_id

    def _wait_open(self) -> None:
        self.begin()
        self._opened.result()

    def _later(self, fn, *args) -> Future:
        """Queue fn(*args) on the tracker's thread, after everything queued before it."""
        self._raise_failure()
        future = self._io.submit(fn, *args)
        self._queued.append(future)
        return future

    def _now(self, fn, *args):
        self.begin()
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
        flat = flatten(params)
        self.loggers.params(flat)
        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in flat.items() if k not in existing]
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
            self._later(self._deliver, self.take_pending())

    def take_pending(self) -> list[tuple[str, float, int, int]]:
        """The buffered metrics as plain (key, value, timestamp, step) rows, removed from the buffer."""
        rows, self._metrics = self._metrics, []
        return rows

    def send(self, rows: list[tuple[str, float, int, int]]) -> bool:
        """Send rows (after any still unsent) and wait. If the store does not take them they are kept (and spooled
        to disk) and tried again on a later send; returns whether everything has been sent."""
        return self._now(self._deliver, list(rows))

    def _accept(self, rows: list[tuple]) -> None:
        """Rows on their way to MLflow (less the steps it has): the other loggers get them now, MLflow next."""
        rows = self._not_logged(rows)
        self.loggers.metrics(rows)
        self._unsent.extend(rows)

    def _deliver(self, rows: list[tuple]) -> bool:
        self._accept(rows)
        if not self._unsent or time.monotonic() < self._retry_at:
            self._save_unsent()
            return not self._unsent
        try:
            send_rows(self._client, self._run_id, self._unsent, BATCH)
        except Exception as e:  # noqa: BLE001 — a store that is down or refuses: keep the rows, carry on
            self._retry_at = time.monotonic() + RETRY_S[min(self._failures, len(RETRY_S) - 1)]
            self._failures += 1
            if self._failures == 1:
                log.warning("MLflow at %s did not take %d metric rows (%s); they are kept and sent again%s", self.uri,
                            len(self._unsent), briefly(e), store_log_note(self.run_dir))
            self._save_unsent()
            return False
        self._sent_all()
        self._save_unsent()
        return True

    def _sent_all(self) -> None:
        if self._failures:
            log.warning("MLflow at %s answers again: %d kept metric rows sent", self.uri, len(self._unsent))
        self._unsent, self._failures, self._retry_at = [], 0, 0.0

    def _save_unsent(self) -> None:
        if self.spool is not None and (self._unsent or self.spool.exists()):
            write_spool(self.spool, self._unsent)

    @property
    def unsent(self) -> int:
        return len(self._unsent)

    def commit(self) -> None:
        self.send(self.take_pending())

    def metric_at(self, key: str, step: int) -> float:
        """A logged value (e.g. the start-of-run evaluation, read back when resuming); NaN if absent."""
        history = self._now(lambda: self._client.get_metric_history(self._run_id, key))
        values = [m.value for m in history if m.step == step]
        return values[-1] if values else float("nan")

    # --- artifacts -----------------------------------------------------------------------------------------
    def log_text(self, text: str, path: str) -> None:
        self._later(self._text, text, path)

    def _text(self, text: str, path: str) -> None:
        self.loggers.text(text, path)
        self._artifact(lambda: self._client.log_text(self._run_id, text, path))

    def log_table(self, columns: Mapping[str, list], path: str) -> None:
        data = dict(columns)
        self._later(self._artifact, lambda: self._client.log_table(self._run_id, data=data, artifact_file=path))

    def _artifact(self, upload) -> None:
        """An upload, tried again for up to close_wait_s while the store does not answer (a server restarting)."""
        wait_for(upload, self.close_wait_s)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def close(self, status: str = "FINISHED", wait_s: float | None = None) -> bool:
        """Send what is left and set the final status, trying for up to wait_s while the store does not answer;
        if it still does not, the status and the rows are left in the run dir for the next start (reconcile).
        Waits for the tracker's thread to finish; returns whether MLflow has everything."""
        rows = self.take_pending() if status == "FINISHED" or not self.hold else []
        # held metrics of a failed run are not logged: they would be logged again on resume
        wait_s = self.close_wait_s if wait_s is None else wait_s
        try:
            self._wait_open()  # a run that could not be opened has nothing to close: its error is raised
            done = self._io.submit(self._finish, rows, status, wait_s).result()
            refused = [f.exception() for f in self._queued if f.exception() is not None]
            if done and refused:  # an artifact the store did not take (when the store is down, the line
                e = refused[0]     # _finish printed already says what MLflow lacks)
                print(f"forge-exp: warning: MLflow at {self.uri} did not take {len(refused)} artifact upload(s) of "
                      f"run {self._run_id} ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})",
                      file=sys.stderr)
            return done and not refused
        finally:
            self._io.shutdown(wait=True)
            self.loggers.close(status)  # FINISHED, FAILED or KILLED, whether MLflow answered or not

    def _finish(self, rows: list[tuple], status: str, wait_s: float) -> bool:
        self._accept(rows)

        def finish() -> None:
            if self._unsent:
                send_rows(self._client, self._run_id, self._unsent, BATCH)
                self._sent_all()
            self._client.set_terminated(self._run_id, status=status)

        try:
            wait_for(finish, wait_s)
        except Exception as e:  # noqa: BLE001
            self._save_unsent()
            if self.owner is not None:
                self.owner.pending(status)
            where = f"; {self.run_dir} keeps them for the next start there" if self.owner else ""
            print(f"forge-exp: warning: MLflow at {self.uri} did not take the run's end within {wait_s:.0f} s "
                  f"({briefly(e)}): run {self._run_id} is not marked {status}, {len(self._unsent)} metric rows "
                  f"unsent{where}{store_log_note(self.run_dir)}", file=sys.stderr)
            return False
        self._save_unsent()
        if self.owner is not None:
            self.owner.release()
        return True

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("FINISHED")
            return
        status = getattr(exc, "run_status", None) or ("KILLED" if issubclass(exc_type, KeyboardInterrupt) else
                                                      "FAILED")
        with contextlib.suppress(Exception):  # the error is what matters; MLflow may be the thing that is down
            self.begin()
            why = (str(exc) or exc_type.__name__).splitlines()[0][:5000]
            key = "forge_exp.error" if status == "FAILED" else "forge_exp.stop"
            self._io.submit(lambda: self._client.set_tag(self._run_id, key, why)).result()  # not queued: a
            # store that is down fails it, and close() says so in its own way
        self.close(status)

    def run_url(self) -> str:
        base = self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else UI
        return f"{base}/#/experiments/{self.experiment_id}/runs/{self.run_id}?workflowType=machine_learning"

