"""The tracking store before and after a run: created once under a lock, probed once, and no run left RUNNING.

- `check_store(uri)`: what the CLI checks before any process starts (a new local store is only checked for a
  writable folder; the tracker creates it on its thread).
- `ensure_store(uri)`: a fresh sqlite store is created and migrated by exactly one process, under an inter-process
  file lock beside the database; several runs started together on a new path otherwise race inside alembic
  ("table latest_metrics already exists", "duplicate column name: step"). An http(s) store is probed once with a
  short timeout, so a server that never answers is one line at start instead of minutes of retries.
- `Ownership` (`<run dir>/.forge_run.json`): which MLflow run this run dir holds, which process drives it, and, if
  that process could not reach MLflow at its end, the status it meant to set. The next start in the same run dir
  (a resume, or a new run) calls `reconcile()`: a run still RUNNING whose controller is gone (SIGKILL, node loss)
  is marked KILLED, a pending final status is applied, and metrics that never reached the server are sent.
- `spool`: rows the tracker could not send, kept on disk (`<run dir>/mlflow_unsent.<run id>.jsonl`) until they are sent.
  MLflow keeps one row per (key, step, timestamp, value), so a row sent twice is stored once.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

OWNER_FILE = ".forge_run.json"
SPOOL_FILE = "mlflow_unsent.{run_id}.jsonl"  # per run: a new run in the same dir never sends the old one's
PROBE_TIMEOUT_S = 5.0
CREATE_ATTEMPTS = 3  # creating a local store, against a creator that does not take the lock
# The MLflow REST client retries 7 times with exponential backoff (~4 min) before it raises. The tracker keeps
# what it could not send and tries again later, so one attempt of a few seconds is what a call should cost.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


class StoreUnavailable(ValueError):
    """The tracking store cannot be reached or created: one line naming tracking.uri."""


class TrackingRefused(RuntimeError):
    """The store refused to open the run once the run was under way (what the checks before the start could not
    foresee): `str()` is the CLI's last line."""


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive inter-process lock for creating or migrating a local store (no-op for a server)."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_store(uri: str) -> None:
    """Create and migrate a local store once (under the lock); probe a server. Raises StoreUnavailable."""
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if uri.startswith(("http://", "https://")):
        for key, value in HTTP_ENV.items():
            os.environ.setdefault(key, value)
        probe(uri)
        return
    path = sqlite_path(uri)
    if path is not None and migrated(path):  # the usual case, checked without importing MLflow (~2 s of start-up)
        return
    with store_lock(uri):
        # Another run may have been creating it while this one waited for the lock: read it again, still without
        # MLflow. Runs started together on a new store then go on one by one as each finds it ready, light, instead
        # of all importing MLflow behind the lock and going on at the same instant with it loaded.
        if path is not None and migrated(path):
            return
        from mlflow.tracking import MlflowClient

        for attempt in range(CREATE_ATTEMPTS):
            try:
                MlflowClient(uri).search_experiments(max_results=1)  # creates and migrates the tables
                return
            except Exception as e:  # noqa: BLE001 — one line naming the key
                # A client that does not take the lock (an MLflow UI, a script) creating the same new store at the
                # same time makes alembic fail here ("table experiments already exists"): wait for it to finish,
                # and create what is left only once it has stopped.
                if path is not None and attempt + 1 < CREATE_ATTEMPTS:
                    if other_creator_done(path):
                        return
                    continue
                raise StoreUnavailable(f"tracking.uri={uri}: cannot open the store ({type(e).__name__}: "
                                       f"{str(e).splitlines()[0] if str(e) else ''})") from e


def other_creator_done(path: Path, quiet_s: float = 5.0, timeout_s: float = 120.0) -> bool:
    """After a creation of the store at `path` failed beside another creator: True once the store is migrated;
    False once its schema revision has not moved for `quiet_s` (the other stopped) or after `timeout_s`."""
    head, last, since = schema_head(), revision(path), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        now = revision(path)  # read once a poll: migrated() is this against the head
        if head is not None and now == head:
            return True
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return False
        time.sleep(0.25)
    return False


STORE_ERRORS = "mlflow.store.db.utils"  # MLflow's SQL store logs each failed write here, at ERROR, with a traceback
STORE_LOG = "mlflow_errors.log"


def quiet_store_errors(run_dir: Path | None) -> None:
    """Send MLflow's SQL store error logs to <run dir>/mlflow_errors.log instead of stderr: a full disk made every
    flush print its traceback and the SQL (1,290 lines before the tracker's own one-line warning, which says what
    happened and names this file)."""
    logger = logging.getLogger(STORE_ERRORS)
    logger.propagate = False  # not up to the "mlflow" logger's stderr handler
    if run_dir is not None and not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        logger.addHandler(logging.FileHandler(run_dir / STORE_LOG, delay=True))  # the first run's of this process
    elif not logger.handlers:
        logger.addHandler(logging.NullHandler())  # a sweep's parent: its tracker's warnings say what happened


def store_log_note(run_dir: Path | None) -> str:
    log_file = run_dir / STORE_LOG if run_dir is not None else None
    return f" (MLflow's own report: {log_file})" if log_file is not None and log_file.is_file() else ""


def briefly(e: BaseException) -> str:
    """An error in a few words: the type and first line of the exception at the root of it (MLflow's wraps
    SQLAlchemy's, which wraps sqlite3's "database or disk is full" in lines of SQL and parameters)."""
    for _ in range(8):
        inner = e.__cause__ or e.__context__
        if inner is None:
            break
        e = inner
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def check_store(uri: str) -> None:
    """What `forge-exp` checks of the store before any process starts, without importing MLflow where it can: a
    server answers; a local store is up to date, or the folder for a new one can be written (the tracker then
    creates it on its thread, ensure_store). Anything else (an older schema, another kind of URI): ensure_store."""
    path = sqlite_path(uri)
    if path is None or path.exists():
        if path is None or not migrated(path):
            ensure_store(uri)
        return
    folder = next(p for p in path.parents if p.exists())  # the nearest folder that exists: the rest gets made
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
        raise StoreUnavailable(f"tracking.uri={uri}: cannot create the store ({folder} is not a writable folder)")


def migrated(path: Path) -> bool:
    """The sqlite store at `path` exists and its schema is at the newest revision of the installed MLflow: nothing
    to create or migrate. Read with the standard library: opening it through MLflow imports mlflow and SQLAlchemy
    first (1.2 s + 0.7 s of the controller's start-up, benchmarks/lean.md)."""
    head = schema_head()
    return head is not None and revision(path) == head


def revision(path: Path) -> str | None:
    """The schema revision the sqlite store at `path` records; None while it has none (no file, an empty one, a
    store being created), or it is locked or not a database."""
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None
    return rows[0][0] if len(rows) == 1 else None


def schema_head() -> str | None:
    """The newest schema revision of the installed MLflow, from its migration scripts (not imported); None if they
    cannot be read or have no single head (then MLflow itself checks the store)."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = Path(list(spec.submodule_search_locations)[0]) / "store" / "db_migrations" / "versions"
    revisions, parents = set(), set()
    for script in versions.glob("*.py"):
        text = script.read_text()
        revision = re.search(r"^revision\s*=\s*['\"](\w+)['\"]", text, re.M)
        down = re.search(r"^down_revision\s*=\s*(.+)$", text, re.M)
        if revision:
            revisions.add(revision.group(1))
        if down:
            parents.update(re.findall(r"['\"](\w+)['\"]", down.group(1)))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One request to the server's /health, with a short timeout."""
    import requests

    try:
        r = requests.get(f"{uri.rstrip('/')}/health", timeout=timeout)
        r.raise_for_status()
    except requests.RequestException as e:
        why = type(e).__name__ if isinstance(e, requests.Timeout) else str(e).split(":")[-1].strip()[:120]
        raise StoreUnavailable(
            f"tracking.uri={uri}: no MLflow server answered within {timeout:.0f} s ({why}); start it "
            f"(launchers/mlflow_server.sh start) or unset tracking.uri / MLFLOW_TRACKING_URI for a local store"
        ) from None


def create_experiment(client, name: str, **kwargs) -> str:
    """The experiment's id, creating it if needed; two runs creating it at once both get the same one."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, **kwargs)
    except Exception:  # noqa: BLE001 — RESOURCE_ALREADY_EXISTS (another run won) or a real error: look again
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


# --- what could not be sent --------------------------------------------------------------------------------------
def read_spool(path: Path) -> list[tuple]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(tuple(json.loads(line)))
        except json.JSONDecodeError:  # a line cut by a kill while it was written
            continue
    return rows


def write_spool(path: Path, rows: list[tuple]) -> None:
    if not rows:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(list(r)) + "\n" for r in rows))
    tmp.replace(path)


# --- who owns the run ------------------------------------------------------------------------------------------
class Ownership:
    """`<run dir>/.forge_run.json`: {uri, run_id, pid, host, create_time, final_status?}."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.path = self.dir / OWNER_FILE

    def read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def claim(self, uri: str, run_id: str) -> None:
        import psutil

        self.dir.mkdir(parents=True, exist_ok=True)
        me = psutil.Process()
        self._write({"uri": uri, "run_id": run_id, "pid": me.pid, "host": socket.gethostname(),
                     "create_time": me.create_time(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")})

    def pending(self, status: str) -> None:
        """MLflow could not be told the final status: leave it here for the next start."""
        state = self.read() or {}
        state["final_status"] = status
        self._write(state)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def _write(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.path)


def controller_alive(state: dict) -> bool:
    """Whether the process that claimed the run still runs (only knowable on its own host)."""
    import psutil

    if state.get("host") != socket.gethostname():
        return False  # a requeued job runs elsewhere; the old one is gone
    try:
        p = psutil.Process(int(state["pid"]))
        return abs(p.create_time() - float(state.get("create_time", 0))) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, KeyError, ValueError, TypeError):
        return False


def reconcile(run_dir: str | os.PathLike) -> str | None:
    """Close what a previous controller of this run dir left open; returns a line saying what was done, or None.
    The run of a controller still at work (alive, not given up on MLflow, not this process) is left alone."""
    owner = Ownership(run_dir)
    state = owner.read()
    if state is None:
        return None
    if controller_alive(state) and not state.get("final_status") and state.get("pid") != os.getpid():
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(state["uri"])
    spool = Path(run_dir) / SPOOL_FILE.format(run_id=state["run_id"])
    rows = read_spool(spool)
    done = []
    try:
        if rows:
            send_rows(client, state["run_id"], rows)
            spool.unlink(missing_ok=True)
            done.append(f"sent {len(rows)} metric rows it had kept")
        run = client.get_run(state["run_id"])
        status = state.get("final_status")
        if run.info.status == "RUNNING":
            if status:
                why = "its status was set on the next start: MLflow could not be reached when it ended"
            else:
                status = "KILLED"
                why = (f"its controller (pid {state.get('pid')} on {state.get('host')}) ended without closing it "
                       f"(SIGKILL, node loss)")
            client.set_tag(state["run_id"], "forge_exp.end", why)
            client.set_terminated(state["run_id"], status=status)
            done.append(f"marked it {status}")
    except Exception as e:  # noqa: BLE001 — never block a start on it; say so
        log.warning("could not reconcile the previous run %s in %s: %s", state.get("run_id"), run_dir, e)
        return None
    owner.release()
    return f"previous run {state['run_id']} in {run_dir}: {', '.join(done)}" if done else None


def last_logged_step(client, run_id: str, key: str = "loss/total") -> int:
    """The run's newest step in MLflow (by `key`, which every loop logs at every step); 0 if none."""
    return max((m.step for m in client.get_metric_history(run_id, key)), default=0)


def send_rows(client, run_id: str, rows: list[tuple], batch: int = 900) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(*row) for row in rows]
    for i in range(0, len(metrics), batch):
        client.log_batch(run_id, metrics=metrics[i: i + batch])


def wait_for(fn, seconds: float, every: float = 2.0):
    """fn() until it returns without raising, for up to `seconds`; re-raises the last error."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except Exception:  # noqa: BLE001
            if time.monotonic() + every > deadline:
                raise
            time.sleep(every)


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
