"""The store before and after a run: created once by several runs at once, a server that does not answer is one
line, rows the store did not take are kept and sent later, and a run its controller left RUNNING is closed by the
next start in its run dir (tracking/store.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psutil
import pytest
from mlflow.tracking import MlflowClient

from forge_exp.tracking.mlflow import Tracker
from forge_exp.tracking.store import HTTP_ENV, OWNER_FILE, SPOOL_FILE, StoreUnavailable, ensure_store, reconcile
from tests.conftest import ROOT


@pytest.mark.slow  # eight runs, each its own Python process
def test_eight_runs_opening_a_fresh_store_at_once_all_keep_every_point(tmp_path):
    uri = f"sqlite:///{tmp_path}/new/mlflow.db"
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests/tracking/store_worker.py"), uri, str(i)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    results = [(p.wait(timeout=240), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in results), [err[-600:] for rc, err in results if rc]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(client.search_experiments()) == 2  # Default + forge-exp, created once
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 8
    for run in runs:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")) == list(range(1, 31))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def test_a_server_that_does_not_answer_is_one_line_naming_the_key():
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(StoreUnavailable, match=rf"^tracking\.uri={uri}: no MLflow server answered within 5 s") as e:
        ensure_store(uri)
    assert "\n" not in str(e.value)


def test_rows_the_store_did_not_take_are_sent_by_the_next_start_in_the_run_dir(tmp_path, monkeypatch):
    for key, value in HTTP_ENV.items():  # as ensure_store sets them for a server: one quick attempt per call
        monkeypatch.setenv(key, value)
    uri, run_dir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    t = Tracker(uri, "exp", run_dir=run_dir, close_wait_s=0)
    t.log_metrics({"loss": 1.0}, step=1)
    assert t.send(t.take_pending())  # the store answers: sent
    t._client = MlflowClient(f"http://127.0.0.1:{_closed_port()}")  # the store goes away (a server that died)
    for step in (2, 3):
        t.log_metrics({"loss": float(step)}, step=step)
    assert not t.send(t.take_pending()) and t.unsent == 2
    spool = run_dir / SPOOL_FILE.format(run_id=t.run_id)
    assert len(spool.read_text().splitlines()) == 2  # on disk: a controller killed now loses nothing
    assert not t.close("FINISHED")  # cannot say FINISHED either: left for the next start
    assert json.loads((run_dir / OWNER_FILE).read_text())["final_status"] == "FINISHED"
    client = MlflowClient(uri)
    assert client.get_run(t.run_id).info.status == "RUNNING"

    line = reconcile(run_dir)  # what the next forge-exp in this run dir does first
    assert "sent 2 metric rows" in line and "marked it FINISHED" in line
    assert client.get_run(t.run_id).info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(t.run_id, "loss")] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert not spool.exists() and not (run_dir / OWNER_FILE).exists()
    assert reconcile(run_dir) is None  # nothing left to do


def test_a_run_whose_controller_vanished_is_marked_killed_and_a_live_one_is_left_alone(tmp_path):
    uri, run_dir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    t = Tracker(uri, "exp", run_dir=run_dir)
    t.run_id  # the run is opened, and claimed, on the tracker's thread
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    state = json.loads((run_dir / OWNER_FILE).read_text())
    (run_dir / OWNER_FILE).write_text(json.dumps({**state, "pid": int(gone.stdout)}))  # as a SIGKILLed one leaves it
    assert "marked it KILLED" in reconcile(run_dir)
    live = Tracker(uri, "exp", run_dir=tmp_path / "live")
    live.run_id
    state = json.loads((tmp_path / "live" / OWNER_FILE).read_text())
    parent = psutil.Process(os.getppid())  # another process, alive
    (tmp_path / "live" / OWNER_FILE).write_text(json.dumps({**state, "pid": parent.pid,
                                                            "create_time": parent.create_time()}))
    assert reconcile(tmp_path / "live") is None
    assert MlflowClient(uri).get_run(live.run_id).info.status == "RUNNING"
    run = MlflowClient(uri).get_run(t.run_id)
    assert run.info.status == "KILLED" and "ended without closing it" in run.data.tags["forge_exp.end"]


def test_a_store_at_the_newest_schema_is_recognised_without_mlflow_and_any_other_is_migrated(tmp_path):
    from mlflow.store.db.utils import _get_latest_schema_revision

    from forge_exp.tracking.store import migrated, schema_head

    assert schema_head() == _get_latest_schema_revision()  # what MLflow itself migrates a store to
    db = tmp_path / "mlflow.db"
    assert not migrated(db)  # no file
    db.write_bytes(b"")
    assert not migrated(db)  # an empty file: no schema yet
    db.unlink()
    ensure_store(f"sqlite:///{db}")  # created and migrated by MLflow
    assert migrated(db)
    import sqlite3

    with sqlite3.connect(db) as conn:  # a store from an older MLflow: its revision is not the head
        conn.execute("UPDATE alembic_version SET version_num = 'f5a4f2784254'")
    assert not migrated(db)
    code = ("import sys; from forge_exp.tracking.store import ensure_store; ensure_store(sys.argv[1]); "
            "print('mlflow' in sys.modules)")
    other = tmp_path / "other.db"  # (MLflow keeps a store per URI open in this process)
    MlflowClient(f"sqlite:///{other}").search_experiments()
    out = subprocess.run([sys.executable, "-c", code, f"sqlite:///{other}"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]  # an existing store: MLflow is not imported


def test_a_new_local_store_is_checked_before_the_run_and_created_by_the_tracker(tmp_path):
    """check_store (the CLI's, before any process starts) leaves a new sqlite store for the tracker's thread to create:
    it neither creates the file nor imports MLflow (whose imports start threads: the controller forks its fork
    server after this check); a folder that cannot hold it is one line naming tracking.uri."""
    uri = f"sqlite:///{tmp_path}/new/deeper/mlflow.db"
    code = ("import sys; from forge_exp.tracking.store import check_store; check_store(sys.argv[1]); "
            "print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
    assert not (tmp_path / "new").exists()
    (tmp_path / "afile").write_text("")
    from forge_exp.tracking.store import check_store

    with pytest.raises(StoreUnavailable, match=rf"^tracking\.uri=sqlite:///{tmp_path}/afile/mlflow\.db: cannot create "
                                               rf"the store \({tmp_path}/afile is not a writable folder\)$"):
        check_store(f"sqlite:///{tmp_path}/afile/mlflow.db")


@pytest.mark.slow
def test_a_store_another_run_is_creating_is_waited_for_without_mlflow(tmp_path):
    """A run that finds the store mid-creation (the file there, its tables not yet) waits for the creator's lock and
    reads the store again with the standard library: it does not import MLflow to find what the creator made."""
    import time

    from forge_exp.tracking.store import store_lock

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    code = ("import sys, time; from forge_exp.tracking.store import ensure_store; t = time.monotonic(); "
            "ensure_store(sys.argv[1]); print(round(time.monotonic() - t, 1), 'mlflow' in sys.modules)")
    with store_lock(uri):  # this test is the creator: the file exists before its tables do
        db.write_bytes(b"")
        waiter = subprocess.Popen([sys.executable, "-c", code, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT)
        time.sleep(4.0)
        assert waiter.poll() is None  # waiting for the lock
        MlflowClient(uri).search_experiments()  # creates and migrates the tables
    out, err = waiter.communicate(timeout=120)
    waited, imported = out.split()
    assert float(waited) >= 1.0, out  # it waited for the lock (4 s less its own start)
    assert imported == "False", err[-2000:]


RACE = """import sys, time
from pathlib import Path
import mlflow  # imported first by both sides, so that they start creating together
from mlflow.tracking import MlflowClient
from forge_exp.tracking.store import ensure_store
uri, role, go = sys.argv[1:]
while not Path(go).exists():
    time.sleep(0.01)
try:
    ensure_store(uri) if role == "run" else MlflowClient(uri).search_experiments()
    print("ok")
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0])
"""


@pytest.mark.slow  # two Python processes a round, each importing MLflow
def test_a_run_creating_its_store_beside_a_client_that_takes_no_lock_opens_it(tmp_path):
    """A client outside forge-exp (an MLflow UI, a script) creating the same new sqlite store at the same moment
    races the run's creation inside alembic; the run waits for the client to finish, reads what was made and goes
    on instead of failing. (The client takes no lock and may fail itself; a store it leaves half-made may be past
    repair, and then the run says so in one line.)"""
    import time

    from forge_exp.tracking.store import migrated

    for i in range(6):
        db, go = tmp_path / f"mlflow{i}.db", tmp_path / f"go{i}"
        procs = {role: subprocess.Popen([sys.executable, "-c", RACE, f"sqlite:///{db}", role, str(go)], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for role in ("run", "client")}
        time.sleep(4.0)  # both have imported MLflow and wait for the go
        go.touch()
        said = {role: p.communicate(timeout=120) for role, p in procs.items()}
        run, client = said["run"][0].strip(), said["client"][0].strip()
        if client == "ok":
            assert run == "ok" and migrated(db), (i, said)
        else:
            assert run == "ok" or run.startswith(f"StoreUnavailable tracking.uri=sqlite:///{db}: "), (i, said)
