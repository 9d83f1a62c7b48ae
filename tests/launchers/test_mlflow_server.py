"""launchers/mlflow_server.sh: a real tracking server on 127.0.0.1, used through the Python client.
(The mlflow_server fixture stops it and asserts that no server process is left.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import MLFLOW_SH, pid_alive, process_group, run_script


@pytest.mark.timeout(120)
def test_server_logs_and_reads_back(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    assert mlflow_server.startswith("http://127.0.0.1:")
    client = MlflowClient(tracking_uri=mlflow_server)
    exp_id = client.create_experiment("launcher-test")
    run = client.create_run(exp_id, run_name="r0")
    for step, loss in enumerate([1.0, 0.5, 0.25]):
        client.log_metric(run.info.run_id, "loss", loss, step=step)
    client.log_text(run.info.run_id, "hello", "notes/hello.txt")  # proxied artifact upload
    client.set_terminated(run.info.run_id)

    again = MlflowClient(tracking_uri=mlflow_server)
    history = again.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert again.get_experiment_by_name("launcher-test").experiment_id == exp_id
    assert again.get_run(run.info.run_id).info.status == "FINISHED"
    assert Path(again.download_artifacts(run.info.run_id, "notes/hello.txt", str(tmp_path))).read_text() == "hello"
    # the store is the sqlite file given to the script (created before the server started); artifacts are local
    assert (tmp_path / "store" / "mlflow.db").stat().st_size > 0
    assert list((tmp_path / "art").rglob("hello.txt"))

    # start again: idempotent; status; 2 processes (one server start only: each costs ~7 s on 2 cores)
    state = ["--state-dir", str(tmp_path / "mlflow-state")]
    pid = int((tmp_path / "mlflow-state" / "mlflow.pid").read_text())
    again = run_script([str(MLFLOW_SH), "start", *state], dict(os.environ))
    assert "already running" in again.stderr
    assert again.stdout.strip() == f"export MLFLOW_TRACKING_URI={mlflow_server}"
    status = run_script([str(MLFLOW_SH), "status", *state], dict(os.environ))
    assert status.stdout.strip() == f"running (pid {pid}) at {mlflow_server}"
    # mlflow CLI + one uvicorn process: no huey job consumer (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false), 1 worker
    assert len([p for p in process_group(pid) if pid_alive(p)]) == 2


def test_status_and_stop_when_not_running(tmp_path):
    state = ["--state-dir", str(tmp_path / "nothing")]
    status = subprocess.run([str(MLFLOW_SH), "status", *state], capture_output=True, text=True)
    assert (status.returncode, status.stdout.strip()) == (3, "not running")
    assert "not running" in run_script([str(MLFLOW_SH), "stop", *state], dict(os.environ)).stderr
