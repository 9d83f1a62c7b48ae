"""What MLflow would refuse is asked before any process starts (tracking/answers.py): a deleted experiment, a run a
resume continues that the store lacks or deleted, a server that answers /health but is not MLflow. Each is one
line naming the key; a good store passes without MLflow being imported for a local store."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow.tracking import MlflowClient

from forge_exp.tracking.answers import check_names
from forge_exp.tracking.store import StoreUnavailable, check_store
from tests.conftest import ROOT


def test_a_local_store_answers_for_its_experiments_and_runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_names(uri, "forge-exp")  # no store yet: it will be created
    with pytest.raises(StoreUnavailable, match=r"^resume=true: the checkpoint's MLflow run abc is not in tracking\.uri="
                                               r"\S+; resume with tracking\.uri=sqlite:///elsewhere\.db$"):
        check_names(uri, "forge-exp", "abc", logged_to="sqlite:///elsewhere.db")
    client = MlflowClient(uri)
    kept, gone = client.create_experiment("kept"), client.create_experiment("gone")
    run = client.create_run(kept).info.run_id
    check_names(uri, "kept", run)
    check_names(uri, "new", run)  # another experiment's name: created; the run id is global
    client.delete_experiment(gone)
    with pytest.raises(StoreUnavailable, match=rf"^tracking\.experiment=gone: the experiment is deleted in \S+; "
                                               rf"restore it \(.* mlflow experiments restore --experiment-id {gone}\)"):
        check_names(uri, "gone")
    client.delete_run(run)
    with pytest.raises(StoreUnavailable, match=rf"^resume=true: the checkpoint's MLflow run {run} is deleted in "):
        check_names(uri, "kept", run)


def test_the_checks_of_a_local_store_do_not_import_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).create_experiment("kept")
    code = ("import sys; from forge_exp.tracking.store import check_store; from forge_exp.tracking.answers import "
            f"check_names; check_store({uri!r}); check_names({uri!r}, 'kept'); print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


class NotMlflow(BaseHTTPRequestHandler):
    """A web server that is up (/health answers) but is not MLflow: everything else is an HTML 404."""

    def do_GET(self):  # noqa: N802
        ok = self.path == "/health"
        body = b"OK" if ok else b"<html>Not Found</html>"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/plain" if ok else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_mlflow_is_one_line():
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        check_store(uri)  # /health answers
        with pytest.raises(StoreUnavailable, match=rf"^tracking\.uri={uri}: the server answers /health but is not an "
                                                   rf"MLflow tracking server \(GET /api/2\.0/mlflow/experiments/"
                                                   rf"get-by-name: HTTP 404, text/html\); check the host and port$"):
            check_names(uri, "forge-exp")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
