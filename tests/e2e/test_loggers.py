"""`logger=[mlflow,tensorboard,wandb]` on the embedded default, end to end: every metric MLflow has, TensorBoard's
event files and the wandb offline run have too, at the same steps, read back with each library's own reader; and
no process is left behind (wandb's `wandb-core` included)."""

from __future__ import annotations

import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.test_cli import descendants_alive, run_watching
from tests.tracking.logger_files import by_step, tensorboard_scalars, tensorboard_texts, wandb_run

# a few steps, no warm start (it is not what is tested): ~35 s a run on 2 cores
SHORT = ["steps=3", "dataset.eval_size=16", "progress=false", "model.warmstart.steps=0"]


def run_with_every_logger(tmp_path, *args: str):
    """`forge-exp logger=[mlflow,tensorboard,wandb]` to its end: (exit code, stdout, stderr, the MLflow client and
    run), once no process it started (wandb-core included) is left."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    cmd = [sys.executable, "-m", "forge_exp.cli", "logger=[mlflow,tensorboard,wandb]", *SHORT, *args,
           f"hydra.run.dir={tmp_path}/run", f"tracking.uri={uri}"]
    code, out, err, seen = run_watching(cmd, timeout=300)
    time.sleep(1.0)
    assert descendants_alive(seen) == [], f"processes left behind (a wandb-core service?): {err[-2000:]}"
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return code, out, err, client, run


def test_every_logger_has_what_mlflow_has_at_the_same_steps(tmp_path):
    code, out, err, client, run = run_with_every_logger(tmp_path)
    assert code == 0, err[-3000:]
    assert run.info.status == "FINISHED"
    mlflow = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
              for k in run.data.metrics}
    assert {"reward/mean", "eval/accuracy", "summary/eval/accuracy_end"} <= set(mlflow), sorted(mlflow)

    tensorboard = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert set(tensorboard) == set(mlflow)
    for key, points in mlflow.items():  # TensorBoard keeps scalars as float32
        steps, values = zip(*points)
        got_steps, got_values = zip(*sorted(tensorboard[key]))
        assert got_steps == steps and got_values == pytest.approx(values, rel=1e-6, abs=1e-6), key
    texts = tensorboard_texts(tmp_path / "run" / "tensorboard")
    assert texts["status"] == "FINISHED" and "steps: 3" in texts["config/resolved.yaml"]

    wandb = wandb_run(tmp_path / "run")
    assert wandb["id"] == run.info.run_id and wandb["exit_code"] == 0
    history = by_step(wandb["history"])
    assert {k: sorted(v) for k, v in history.items()} == mlflow  # JSON floats: exactly MLflow's values
    assert wandb["config"]["steps"] == 3 and wandb["config"]["logger.wandb.name"] == "wandb"
    assert "steps: 3" in (wandb["files"] / "config" / "resolved.yaml").read_text()
    assert "wandb" not in out.lower() and "wandb:" not in err  # silent: the run's own lines only


def test_a_failed_run_closes_every_logger(tmp_path):
    """The trainer's loss raises at the first step: MLflow has the run FAILED, and so do the others."""
    code, _, err, _, run = run_with_every_logger(tmp_path, "algorithm.loss._target_=tests.e2e.boom.BoomLoss")
    assert code == 1 and "boom at step 1" in err
    assert run.info.status == "FAILED"
    assert tensorboard_texts(tmp_path / "run" / "tensorboard")["status"] == "FAILED"
    assert wandb_run(tmp_path / "run")["exit_code"] == 1
