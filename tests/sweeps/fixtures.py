"""The sweep the sweep, notebook and browser tests share (a pytest plugin: tests/conftest.py pytest_plugins).

slurm_sweep (session): `forge-exp -m algorithm.beta=0,0.04 algorithm.clip_high=0.2,0.28 hydra/launcher=submitit_slurm`
  with tiny settings on the single-node SLURM (slurm_cluster), logging to a real `mlflow server`
  (launchers/mlflow_server.sh) that stays up for the session; run once, stopped at the end.
run_sweep(...): the same command line with any overrides, returning the finished process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launchers.fixtures import running_mlflow_server

REPO = Path(__file__).resolve().parents[2]
FORGE_EXP = Path(sys.executable).parent / "forge-exp"  # the console script: jobs import forge_exp.cli by name
TINY = [
    "steps=3", "model.warmstart.steps=0", "dataset.eval_size=16", "algorithm.prompts_per_step=4",
    "algorithm.group_size=4", "progress=false",
]  # fmt: skip
GRID = ["algorithm.beta=0,0.04", "algorithm.clip_high=0.2,0.28"]


@dataclass
class Sweep:
    proc: subprocess.CompletedProcess
    uri: str
    sweep_dir: Path
    state: dict  # forge_sweep.json: uri, experiment, experiment_id, parent_run_id, sweep_dir, swept

    @property
    def parent_run_id(self) -> str:
        return self.state["parent_run_id"]


def sweep_command(*overrides: str, root: Path, uri: str | None = None) -> list[str]:
    uri = uri or f"sqlite:///{root}/mlruns/mlflow.db"
    return [str(FORGE_EXP), "-m", *overrides, *TINY, f"tracking.uri={uri}", f"hydra.sweep.dir={root}/sweep"]


def isolated(env: dict[str, str], root: Path) -> dict[str, str]:
    """env with an empty cluster file: a developer's ~/.config/forge-exp/cluster.yaml must not reach the tests."""
    (root / "cluster.yaml").write_text("")
    return {**env, "FORGE_EXP_CLUSTER_CONFIG": str(root / "cluster.yaml")}


def run_sweep(*overrides: str, root: Path, env: dict[str, str], uri: str | None = None, timeout: float = 300) -> Sweep:
    env = isolated(env, root)
    proc = subprocess.run(sweep_command(*overrides, root=root, uri=uri), cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    state_file = root / "sweep" / "forge_sweep.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    return Sweep(proc, state.get("uri", uri or ""), root / "sweep", state)


@pytest.fixture(scope="session")
def slurm_sweep(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_sweep")
    with running_mlflow_server(root) as uri:
        sweep = run_sweep(*GRID, "hydra/launcher=submitit_slurm", root=root, env=slurm_cluster, uri=uri)
        assert sweep.proc.returncode == 0, sweep.proc.stdout[-3000:] + sweep.proc.stderr[-5000:]
        yield sweep
