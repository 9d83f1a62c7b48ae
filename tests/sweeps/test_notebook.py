"""notebooks/compare_runs.ipynb runs headless (nbclient) against the sweep the suite just ran, saves its plots, and
fails when a plot would be empty."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from mlflow.tracking import MlflowClient
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "compare_runs.ipynb"


def execute(monkeypatch, tmp_path: Path, uri: str, parent_run_id: str) -> Path:
    plots = tmp_path / "plots"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the kernel inherits this process's environment
    monkeypatch.setenv("SWEEP_PARENT_RUN_ID", parent_run_id)
    monkeypatch.setenv("SWEEP_PLOTS_DIR", str(plots))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return plots


def test_notebook_plots_the_sweep(slurm_sweep, monkeypatch, tmp_path):
    plots = execute(monkeypatch, tmp_path, slurm_sweep.uri, slurm_sweep.parent_run_id)
    for name in ("curves.png", "final_vs_hparams.png"):
        assert (plots / name).stat().st_size > 10_000, name


def test_notebook_fails_on_an_empty_plot(monkeypatch, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("forge-exp")
    parent = client.create_run(exp, tags={"forge_exp.sweep": "parent"}).info.run_id
    child = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
    for key, value in {"algorithm.beta": "0.04", "algorithm.clip_low": "0.2", "algorithm.clip_high": "0.28"}.items():
        client.log_param(child, key, value)  # a child that logged no metric: every plot would be empty
    with pytest.raises(CellExecutionError, match="is empty"):
        execute(monkeypatch, tmp_path, uri, parent)
