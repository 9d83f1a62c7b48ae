"""Composing the config as the CLI does (aliases expanded), without running anything."""

from __future__ import annotations

import subprocess
import sys

from forge_exp.config.compose import compose
from tests.conftest import CONF, ROOT


def compose_cfg(*overrides: str):
    return compose(list(overrides))


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def run_cli(*args: str, timeout: int = 120, env: dict | None = None, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forge_exp.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.strip()]


def typed(*overrides: str):
    """The typed config (what services receive) for these overrides."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose_cfg(*overrides))


def run_experiment(tmp_path, *args: str, timeout: int = 900):
    """A whole `forge-exp` run into its own MLflow store: (the finished process, the client, the run)."""
    import os

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "forge_exp.cli", *args, "progress=false", f"hydra.run.dir={tmp_path}/run",
           f"tracking.uri={uri}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # actor processes import test modules
    assert done.returncode == 0, done.stderr[-4000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return done, client, run


def metric_history(client, run, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
