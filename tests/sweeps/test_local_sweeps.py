"""Sweeps without SLURM: Hydra's basic launcher (one job after another, in this process) and submitit_local
(processes on this machine) with the Optuna named sweep. Same MLflow layout: a parent run and a child per job."""

from __future__ import annotations

import os

import yaml
from mlflow.tracking import MlflowClient

from tests.sweeps.fixtures import run_sweep


def check_parent_and_children(sweep, n: int, launcher: str, sweeper: str) -> list:
    assert sweep.proc.returncode == 0, sweep.proc.stdout[-2000:] + sweep.proc.stderr[-3000:]
    client = MlflowClient(sweep.uri)
    parent = client.get_run(sweep.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["forge_exp.sweep.launcher"] == launcher
    assert parent.data.tags["forge_exp.sweep.sweeper"] == sweeper
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{sweep.parent_run_id}'")
    assert len(runs) == n and all(r.info.status == "FINISHED" for r in runs)
    assert f"forge-exp sweep finished: {n} of {n} jobs finished" in sweep.proc.stdout
    return runs


def test_basic_launcher_sweep(tmp_path):
    sweep = run_sweep("algorithm.beta=0", "algorithm.clip_high=0.2,0.28", root=tmp_path, env=dict(os.environ))
    runs = check_parent_and_children(sweep, 2, "BasicLauncher", "BasicSweeper")
    assert sorted(r.data.params["algorithm.loss.clip_high"] for r in runs) == ["0.2", "0.28"]


def test_optuna_named_sweep_on_submitit_local(tmp_path):
    sweep = run_sweep("+sweep=grpo_beta_clip_optuna", "hydra/launcher=submitit_local", "hydra.sweeper.n_trials=2",
                      "hydra.sweeper.n_jobs=2", root=tmp_path, env=dict(os.environ))
    runs = check_parent_and_children(sweep, 2, "LocalLauncher", "OptunaSweeper")
    for r in runs:  # TPE's samples from the named sweep's intervals
        assert 0 <= float(r.data.params["algorithm.loss.beta"]) <= 0.1
        assert 0.2 <= float(r.data.params["algorithm.loss.clip_high"]) <= 0.4
    best = yaml.safe_load((sweep.sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(r.data.metrics["summary/eval/accuracy_end"] for r in runs)
