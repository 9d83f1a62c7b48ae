"""A run killed mid-way (as a preempted job is) resumes from its last checkpoint into the same MLflow run, with every
step logged exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.conftest import ROOT

ARGS = ["steps=10", "model.warmstart.steps=20", "algorithm.beta=0", "checkpoint.every=2", "progress=false",
        "dataset.eval_size=32", "algorithm.lr=1e-3"]


def test_killed_run_resumes_into_the_same_mlflow_run(tmp_path):
    common = [f"hydra.run.dir={tmp_path}/run", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
              f"model.warmstart.cache_dir={tmp_path}/cache"]
    cmd = [sys.executable, "-m", "forge_exp.cli", *ARGS, *common]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marker = Path(tmp_path) / "run" / "checkpoints" / "step_0000004" / "metrics_flushed"
    deadline = time.time() + 240
    while not marker.exists():
        assert first.poll() is None, first.stderr.read()[-2000:]
        assert time.time() < deadline, "no checkpoint at step 4"
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)  # no clean-up chance: what preemption looks like
    first.wait()

    second = subprocess.run([*cmd, "resume=true"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run_id = runs[0].info.run_id
    for key in ("reward/mean", "train/version", "loss/total"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(1, 11)), (key, steps)
    versions = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/version"))
    assert versions == [(s, float(s)) for s in range(1, 11)]  # the optimizer step count continues, not restarts
