"""The tracker against a real local MLflow store."""

import pytest
from mlflow.tracking import MlflowClient

from forge_exp.tracking.mlflow import Tracker, default_tracking_uri, flatten
from forge_exp.tracking.store import TrackingRefused


def test_flatten_gives_dotted_keys():
    assert flatten({"algorithm": {"beta": 0.04, "loss": {"_target_": "x.Y"}}, "steps": 3, "l": [1, {"a": 2}]}) == {
        "algorithm.beta": 0.04, "algorithm.loss._target_": "x.Y", "steps": 3, "l.0": 1, "l.1.a": 2,
    }


def test_default_uri_is_a_sqlite_store_under_mlruns(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert default_tracking_uri(tmp_path) == "http://127.0.0.1:5999"


def test_run_holds_params_batched_metrics_and_artifacts(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with Tracker(uri, "exp", run_name="r", tags={"k": "v"}) as t:
        t.log_params({"algorithm": {"beta": 0.04}, "steps": 5})
        for step in range(1200):  # more than one log_batch call
            t.log_metrics({"reward/mean": step / 1200, "not/a/number": "x"}, step=step)
        t.log_text("a: 1\n", "config/resolved.yaml")
        t.log_table({"prompt": ["1+1="], "completion": ["2"], "reward": [1.0]}, "samples/completions.json")
    client = MlflowClient(uri)
    run = client.get_run(t.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"algorithm.beta": "0.04", "steps": "5"}
    assert run.data.tags["k"] == "v"
    history = client.get_metric_history(t.run_id, "reward/mean")
    assert len(history) == 1200 and history[-1].value == pytest.approx(1199 / 1200)
    assert "not/a/number" not in run.data.metrics
    paths = {a.path for a in client.list_artifacts(t.run_id, "config")} | {
        a.path for a in client.list_artifacts(t.run_id, "samples")
    }
    assert paths == {"config/resolved.yaml", "samples/completions.json"}


def test_the_store_and_the_run_open_at_begin_or_when_something_waits_for_them(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = Tracker(uri, "exp", run_name="later")
    t.log_params({"steps": 5})  # queued behind the open
    t.log_metrics({"loss": 1.0}, step=1)
    assert not (tmp_path / "mlflow.db").exists() and not t._opened.done()  # nothing opened before begin()
    t.begin()
    t.close()
    run = MlflowClient(uri).get_run(t.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"steps": "5"} and run.data.metrics["loss"] == 1.0
    waiting = Tracker(uri, "exp")  # nobody calls begin(): asking for the run id opens it
    assert MlflowClient(uri).get_run(waiting.run_id).info.status == "RUNNING"
    waiting.close()


def test_failed_app_marks_the_run_failed_and_keeps_what_was_logged(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(RuntimeError):
        with Tracker(uri, "exp") as t:
            t.log_metrics({"loss": 1.0}, step=1)
            raise RuntimeError("boom")
    run = MlflowClient(uri).get_run(t.run_id)
    assert run.info.status == "FAILED" and run.data.metrics["loss"] == 1.0


def test_a_store_that_refuses_the_run_under_way_is_one_line_naming_the_uri(tmp_path):
    """What the checks before the start could not foresee (the experiment deleted after them, say)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    client.delete_experiment(client.create_experiment("exp"))
    t = Tracker(uri, "exp")
    t.begin()
    with pytest.raises(TrackingRefused, match=rf"^tracking\.uri={uri}: MLflow did not open the run of experiment 'exp' "
                                              r"\(MlflowException: .*deleted.*\)$"):
        t.run_id
    with pytest.raises(TrackingRefused):  # the next call to the tracker says the same
        t.log_metrics({"loss": 1.0}, step=1)


def test_a_resume_from_an_older_checkpoint_logs_no_step_twice(tmp_path, capsys):
    """Steps 1-8 logged, the checkpoint of step 8 lost: resumed from step 4, steps 5-8 are trained again; MLflow keeps
    their first values (it cannot delete points), the run says so in a tag, and steps 9-10 are logged once."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with Tracker(uri, "exp", hold=True) as first:
        for step in range(1, 9):
            first.log_metrics({"loss/total": float(step), "eval/accuracy": 0.5}, step=step)
        first.commit()
    with Tracker(uri, "exp", run_id=first.run_id, resume_step=4, hold=True) as again:
        for step in range(5, 11):
            again.log_metrics({"loss/total": -float(step), "eval/accuracy": 0.9}, step=step)
            if step == 6:
                again.commit()
    client = MlflowClient(uri)
    for key in ("loss/total", "eval/accuracy"):
        assert sorted(m.step for m in client.get_metric_history(first.run_id, key)) == list(range(1, 11)), key
    values = {m.step: m.value for m in client.get_metric_history(first.run_id, "loss/total")}
    assert [values[s] for s in (4, 5, 8, 9, 10)] == [4.0, 5.0, 8.0, -9.0, -10.0]
    tag = client.get_run(first.run_id).data.tags["forge_exp.rewound"]
    assert tag == "steps 5-8 were trained again from the checkpoint of step 4; MLflow keeps their first values"
    assert "has steps 5-8 already" in capsys.readouterr().err


def test_child_run_points_at_its_parent(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with Tracker(uri, "exp", run_name="sweep") as parent:
        with Tracker(uri, "exp", parent_run_id=parent.run_id) as child:
            pass
    assert MlflowClient(uri).get_run(child.run_id).data.tags["mlflow.parentRunId"] == parent.run_id


def test_send_returns_once_the_rows_are_stored_and_flush_does_not_wait(tmp_path):
    """The store is written on the tracker's thread: send() (what checkpoints rely on) is durable when it returns;
    flush() only queues, and close() waits for what was queued."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with Tracker(uri, "exp") as t:
        t.send([("a", 1.0, 0, 1)])
        assert [m.value for m in MlflowClient(uri).get_metric_history(t.run_id, "a")] == [1.0]
        t.log_metrics({"b": 2.0}, step=1)
        t.flush()
        t.log_params({"x": 1})
    run = MlflowClient(uri).get_run(t.run_id)
    assert run.data.metrics == {"a": 1.0, "b": 2.0} and run.data.params == {"x": "1"}
    assert run.info.status == "FINISHED"


def test_a_store_that_cannot_be_opened_fails_the_next_call(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    t = Tracker(f"sqlite:///{blocker}/mlruns/mlflow.db", "exp")  # returns at once: the store opens on a thread
    for call in (lambda: t.run_id, lambda: t.log_metrics({"loss": 1.0}, step=1), t.close):
        with pytest.raises(TrackingRefused, match=r"did not open the run of experiment 'exp' \(NotADirectoryError"):
            call()
