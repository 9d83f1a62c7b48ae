"""The MLflow server goes down in the middle of a run. The run goes on; what the server did not take is kept (on
disk too) and sent when it answers again, so the run ends FINISHED with every step once. If it never comes back,
the run says so in one line and leaves the rows and the final status to the next start in its run dir."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from forge_exp.tracking.answers import check_names
from forge_exp.tracking.store import StoreUnavailable
from tests.faults.helpers import Run, cli, steps, the_run
from tests.launchers.fixtures import MLFLOW_SH, free_port, pid_alive, process_group, run_script


class Server:
    """launchers/mlflow_server.sh on a fixed port and store, which can crash (SIGKILL) and start again."""

    def __init__(self, root: Path):
        self.state, self.port = root / "mlflow-state", free_port()
        self.args = ["--state-dir", str(self.state), "--port", str(self.port),
                     "--backend-store-uri", f"sqlite:///{root}/store/mlflow.db", "--artifacts-destination",
                     str(root / "art")]
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        run_script([str(MLFLOW_SH), "start", *self.args], dict(os.environ), timeout=120)

    def crash(self) -> None:
        pid = int((self.state / "mlflow.pid").read_text())
        for p in process_group(pid):
            os.kill(p, signal.SIGKILL)
        deadline = time.time() + 10
        while any(pid_alive(p) for p in process_group(pid)) and time.time() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        run_script([str(MLFLOW_SH), "stop", "--state-dir", str(self.state)], dict(os.environ))


def answers_of_a_real_server(uri: str) -> None:
    """What tracking/answers.py asks before a start, asked of this MLflow server over its REST API."""
    client, r = the_run(uri)
    check_names(uri, "forge-exp", r.info.run_id)
    with pytest.raises(StoreUnavailable, match=r"run 0{32} is not in tracking\.uri="):
        check_names(uri, "forge-exp", "0" * 32)
    client.delete_experiment(client.create_experiment("gone"))
    with pytest.raises(StoreUnavailable, match=r"^tracking\.experiment=gone: the experiment is deleted in "):
        check_names(uri, "gone")


def test_a_server_that_crashes_and_comes_back_loses_no_step(tmp_path, warmstart_cache):
    server = Server(tmp_path)
    server.start()
    try:
        run = Run(cli(tmp_path, warmstart_cache, "steps=24", "checkpoint.every=2", uri=server.uri))
        run.wait_for(tmp_path / "run" / "checkpoints" / "step_0000002" / "metrics_flushed")
        server.crash()
        run.wait_for(tmp_path / "run" / "checkpoints" / "step_0000006" / "state.json")  # training goes on
        time.sleep(5)
        server.start()
        rc, _, err = run.finish(300)
        assert rc == 0, err[-3000:]
        said = run.out + err
        assert "did not take" in said and "answers again" in said
        client, r = the_run(server.uri)
        assert r.info.status == "FINISHED"
        for key in ("loss/total", "reward/mean", "train/version"):
            assert steps(client, r.info.run_id, key) == list(range(1, 25)), key
        assert run.orphans() == []
    finally:
        server.stop()


def test_a_server_gone_for_good_leaves_the_run_to_the_next_start(tmp_path, warmstart_cache):
    server = Server(tmp_path)
    server.start()
    try:
        args = ["checkpoint.every=4", "tracking.close_wait_s=3"]
        run = Run(cli(tmp_path, warmstart_cache, "steps=12", *args, uri=server.uri))
        run.wait_for(tmp_path / "run" / "checkpoints" / "step_0000004" / "metrics_flushed")
        server.crash()
        rc, _, err = run.finish(300)
        assert rc == 0, err[-3000:]  # the training itself finished; the line says what MLflow lacks
        warning = [line for line in err.splitlines() if line.startswith("forge-exp: warning: MLflow at")]
        assert len(warning) == 1 and "is not marked FINISHED" in warning[0] and "keeps them" in warning[0]
        assert list((tmp_path / "run").glob("mlflow_unsent.*.jsonl"))

        server.start()  # back, later: train 4 steps more in the same run dir
        answers_of_a_real_server(server.uri)
        again = Run(cli(tmp_path, warmstart_cache, "steps=16", *args, "resume=true", uri=server.uri))
        rc, _, err = again.finish(300)
        assert rc == 0, err[-3000:]
        assert "sent" in err and "metric rows it had kept" in err and "marked it FINISHED" in err
        client, r = the_run(server.uri)
        assert r.info.status == "FINISHED"
        assert steps(client, r.info.run_id) == list(range(1, 17))
        assert not list((tmp_path / "run").glob("mlflow_unsent.*.jsonl"))
    finally:
        server.stop()
