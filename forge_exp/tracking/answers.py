"""What the tracking store will answer when the run opens, asked before any process starts: the experiment is not
deleted, the run a resume continues is in this store (and not deleted), a server is an MLflow server. Each refusal
is a StoreUnavailable (a ValueError: one line naming the key, exit 2) instead of MLflow's traceback once the
services are up. A local store is read with the standard library's sqlite3, a server with one HTTP request per
question: MLflow itself is not imported here (~1.2 s of the controller's start-up, benchmarks/lean.md).

    check_names(uri, experiment, run_id)     after tracking/store.py: check_store(uri), which probes and creates;
                                             returns the run's params (a resume compares its config with them)
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass, field
from urllib.parse import quote

from forge_exp.tracking.store import PROBE_TIMEOUT_S, StoreUnavailable, migrated, sqlite_path


@dataclass
class Found:
    """What the store holds of the experiment and the run; None for what it does not have."""

    experiment_stage: str | None = None  # "active" | "deleted"
    experiment_id: str | None = None
    run_stage: str | None = None
    params: dict[str, str] = field(default_factory=dict)  # the run's params: its config as it was first started


def check_names(uri: str, experiment: str, run_id: str | None = None, logged_to: str | None = None) -> dict:
    """The experiment is usable (absent: it will be created; deleted: refused) and `run_id` (a resume's) is there;
    returns that run's params ({} without one). `logged_to`: the store the checkpoint names, for the message."""
    path = sqlite_path(uri)
    if path is not None:
        found = _sqlite_answers(path, experiment, run_id) if migrated(path) else Found()
    elif uri.startswith(("http://", "https://")):
        found = _server_answers(uri, experiment, run_id)
    else:
        found = _client_answers(uri, experiment, run_id)
    if found.experiment_stage == "deleted":
        raise StoreUnavailable(f"tracking.experiment={experiment}: the experiment is deleted in {uri}; restore it "
                               f"(MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id "
                               f"{found.experiment_id}) or give another tracking.experiment")
    if run_id is None:
        return {}
    if found.run_stage is None:
        where = f"tracking.uri={logged_to}" if logged_to and logged_to != uri else "the tracking.uri it was logged to"
        raise StoreUnavailable(f"resume=true: the checkpoint's MLflow run {run_id} is not in tracking.uri={uri}; "
                               f"resume with {where}")
    if found.run_stage == "deleted":
        raise StoreUnavailable(f"resume=true: the checkpoint's MLflow run {run_id} is deleted in {uri}; restore it "
                               f"(MLFLOW_TRACKING_URI={uri} mlflow runs restore --run-id {run_id}) or start a new "
                               f"run in another hydra.run.dir")
    return found.params


def _sqlite_answers(path, experiment: str, run_id: str | None) -> Found:
    """Read from the store's own tables."""
    found = Found()
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        exp = db.execute("SELECT lifecycle_stage, experiment_id FROM experiments WHERE name = ?",
                         (experiment,)).fetchone()
        if exp:
            found.experiment_stage, found.experiment_id = exp[0], str(exp[1])
        run = run_id and db.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
        if run:
            found.run_stage = run[0]
            found.params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)).fetchall())
    return found


def _server_answers(uri: str, experiment: str, run_id: str | None) -> Found:
    found = Found()
    if exp := _get(uri, f"experiments/get-by-name?experiment_name={quote(experiment)}", "experiment"):
        found.experiment_stage, found.experiment_id = exp.get("lifecycle_stage", "active"), exp.get("experiment_id")
    if run_id and (run := _get(uri, f"runs/get?run_id={quote(run_id)}", "run")):
        found.run_stage = run.get("info", {}).get("lifecycle_stage", "active")
        found.params = {p["key"]: p["value"] for p in run.get("data", {}).get("params", [])}
    return found


def _get(uri: str, call: str, kind: str) -> dict | None:
    """The experiment or run a REST call asks for, as the server describes it; None when it has none."""
    import requests

    url = f"{uri.rstrip('/')}/api/2.0/mlflow/{call}"
    try:
        r = requests.get(url, timeout=PROBE_TIMEOUT_S, **_auth())
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
    except (requests.RequestException, ValueError) as e:
        raise StoreUnavailable(f"tracking.uri={uri}: no answer from {url} ({type(e).__name__}); is it an MLflow "
                               f"tracking server?") from None
    if r.status_code in (401, 403):
        raise StoreUnavailable(f"tracking.uri={uri}: the server refused forge-exp (HTTP {r.status_code}); set "
                               f"MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    if r.status_code == 200 and isinstance(body, dict) and isinstance(body.get(kind), dict):
        return body[kind]
    if isinstance(body, dict) and body.get("error_code") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
        return None
    raise StoreUnavailable(f"tracking.uri={uri}: the server answers /health but is not an MLflow tracking server "
                           f"(GET /api/2.0/mlflow/{call.split('?')[0]}: HTTP {r.status_code}, "
                           f"{r.headers.get('content-type') or 'no content type'}); check the host and port")


def _auth() -> dict:
    """What MLflow's own client sends to a server that asks for credentials (its environment variables)."""
    if token := os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"headers": {"Authorization": f"Bearer {token}"}}
    if user := os.environ.get("MLFLOW_TRACKING_USERNAME"):
        return {"auth": (user, os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))}
    return {}


def _client_answers(uri: str, experiment: str, run_id: str | None) -> Found:
    """Any other kind of store (a database URI, file:): through MLflow's client."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = Found()
    if exp := client.get_experiment_by_name(experiment):
        found.experiment_stage, found.experiment_id = exp.lifecycle_stage, exp.experiment_id
    if run_id:
        with contextlib.suppress(MlflowException):
            run = client.get_run(run_id)
            found.run_stage, found.params = run.info.lifecycle_stage, dict(run.data.params)
    return found
