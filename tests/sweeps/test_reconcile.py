"""A sweep's parent closes the children its jobs left RUNNING (a job SIGKILLed, or one whose node died), once every
job has ended; finished children keep their status."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from forge_exp.launch.sweep import reconcile_children
from forge_exp.tracking.mlflow import Tracker


def test_children_left_running_are_marked_killed_by_the_parent(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    parent = Tracker(uri, "exp", run_name="sweep")
    with Tracker(uri, "exp", parent_run_id=parent.run_id) as done:
        pass
    lost = Tracker(uri, "exp", parent_run_id=parent.run_id)  # its process died without closing it
    other = Tracker(uri, "exp")  # not a child of this sweep: left alone
    _ = lost.run_id, other.run_id  # the trackers open their runs on their own threads: wait until they are there
    state = {"experiment_id": parent.experiment_id, "parent_run_id": parent.run_id}
    client = MlflowClient(uri)
    assert reconcile_children(client, state) == [lost.run_id]
    assert client.get_run(lost.run_id).info.status == "KILLED"
    assert "marked by the sweep's parent" in client.get_run(lost.run_id).data.tags["forge_exp.end"]
    assert client.get_run(done.run_id).info.status == "FINISHED"
    assert client.get_run(other.run_id).info.status == "RUNNING"
    assert reconcile_children(client, state) == []
