"""The loggers beside MLflow, through the tracker and their real libraries: they get what MLflow gets (hold mode
and a failed run included), they are closed on every exit, and one that breaks does not stop the run."""

from __future__ import annotations

import psutil
import pytest
from mlflow.tracking import MlflowClient

from forge_exp.tracking.loggers import TensorBoard, Wandb
from forge_exp.tracking.mlflow import Tracker
from tests.tracking.logger_files import by_step, tensorboard_scalars, tensorboard_texts, wandb_run


def no_wandb_service() -> bool:
    return not any("wandb-core" in " ".join(c.cmdline()) for c in psutil.Process().children(recursive=True))


def loggers(run_dir):
    return {"tensorboard": TensorBoard(str(run_dir)), "wandb": Wandb(str(run_dir), project="p")}


@pytest.mark.slow  # wandb starts its wandb-core process
def test_a_failed_run_closes_every_logger_with_what_mlflow_took(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="boom"):
        with Tracker(uri, "exp", run_name="r", hold=True, run_dir=run_dir, loggers=loggers(run_dir)) as t:
            t.log_params({"algorithm": {"beta": 0.04}})
            t.log_text("steps: 2\n", "config/resolved.yaml")
            t.log_metrics({"reward/mean": 0.25, "loss/total": 1.5}, step=1)
            t.commit()  # a checkpoint's metrics: sent to MLflow, and to the others
            t.log_metrics({"reward/mean": 0.5}, step=2)  # held, never committed: nobody logs it
            raise RuntimeError("boom")
    run = MlflowClient(uri).get_run(t.run_id)
    assert run.info.status == "FAILED"
    assert tensorboard_scalars(run_dir / "tensorboard") == {"reward/mean": [(1, 0.25)], "loss/total": [(1, 1.5)]}
    texts = tensorboard_texts(run_dir / "tensorboard")
    assert texts["status"] == "FAILED" and "algorithm.beta | 0.04" in texts["params"]
    wandb = wandb_run(run_dir)
    assert wandb["id"] == t.run_id and wandb["exit_code"] == 1
    assert by_step(wandb["history"]) == {"reward/mean": [(1, 0.25)], "loss/total": [(1, 1.5)]}
    assert wandb["config"] == {"algorithm.beta": 0.04}
    assert (wandb["files"] / "config" / "resolved.yaml").read_text() == "steps: 2\n"
    assert no_wandb_service()


class Broken:
    def open(self, run_id, run_name, experiment):
        raise OSError("disk full")


def test_a_logger_that_fails_is_named_once_and_the_run_goes_on(tmp_path, capfd):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    run_dir = tmp_path / "run"
    others = {"mine": Broken(), "tensorboard": TensorBoard(str(run_dir))}
    with Tracker(uri, "exp", run_dir=run_dir, loggers=others) as t:
        t.log_metrics({"reward/mean": 1.0}, step=3)
    assert MlflowClient(uri).get_run(t.run_id).info.status == "FINISHED"
    assert tensorboard_scalars(run_dir / "tensorboard") == {"reward/mean": [(3, 1.0)]}
    err = [line for line in capfd.readouterr().err.splitlines() if "logger." in line]
    assert err == ["forge-exp: warning: logger.mine could not open (OSError: disk full); it logs nothing more in "
                   "this run (MLflow has everything)"]


def test_a_missing_library_is_one_line_naming_the_extra():
    from forge_exp.tracking.loggers import _needs

    with pytest.raises(ImportError, match=r"^logger=no_such_lib needs the no_such_lib package: pip install "
                                          r"'forge-exp\[no_such_lib\]'$"):
        _needs("no_such_lib").__func__()


def test_a_resume_from_an_older_checkpoint_logs_no_step_twice_anywhere(tmp_path):
    """The run logged steps 1-4, its checkpoint of step 4 was lost: steps 3-4 are trained again from step 2's, and
    neither MLflow nor TensorBoard (a new event file in the same directory) takes them twice."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    run_dir = tmp_path / "run"
    with Tracker(uri, "exp", run_dir=run_dir, loggers={"tensorboard": TensorBoard(str(run_dir))}) as first:
        for step in range(1, 5):
            first.log_metrics({"loss/total": step / 10}, step=step)
    with Tracker(uri, "exp", run_id=first.run_id, resume_step=2, run_dir=run_dir,
                 loggers={"tensorboard": TensorBoard(str(run_dir))}) as again:
        for step in range(3, 7):
            again.log_metrics({"loss/total": step / 10 + 1}, step=step)  # other values: which one is kept shows
    history = MlflowClient(uri).get_metric_history(first.run_id, "loss/total")
    mlflow = sorted((m.step, m.value) for m in history)
    assert mlflow == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 1.5), (6, 1.6)]
    steps, values = zip(*sorted(tensorboard_scalars(run_dir / "tensorboard")["loss/total"]))
    assert list(steps) == [s for s, _ in mlflow] and values == pytest.approx([v for _, v in mlflow])  # float32
