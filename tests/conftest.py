"""Shared test fixtures. Monarch's default fault hook exits the process when an actor fails; tests replace it so one
failing actor fails its test, not the whole pytest run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# shared daemons and runs: one SLURM cluster (slurm_cluster, slurm_env), mlflow_server, and the SLURM sweep that
# tests/sweeps and tests/browser both look at (slurm_sweep); the real pretrained model (smollm2, smollm2_gguf)
pytest_plugins = ["tests.launchers.fixtures", "tests.sweeps.fixtures", "tests.models.smollm2"]


@pytest.fixture(autouse=True, scope="session")
def _monarch_fault_hook():
    try:
        import monarch.actor
    except ImportError:
        yield
        return
    failures = []
    original = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = failures.append
    yield failures
    monarch.actor.unhandled_fault_hook = original


@pytest.fixture(scope="session")
def warmstart_cache(tmp_path_factory):
    """One warm-start cache for every end-to-end run of the pytest run: the first run trains it, the others load it.
    Under xdist the workers share it (their base temp folders are siblings in the run's), so a warm start one worker
    trained is not trained again by the other. A warm start is written aside and swapped into place whole
    (models/checkpoint.py move_into_place), so a run reading it never finds part of one."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    cache = base / "warmstart-cache"
    cache.mkdir(exist_ok=True)
    return cache


# The fast tier (`pytest -m "not slow"`, a few minutes on 2 cores) leaves out whatever starts the platform for real:
# whole CLI runs, sweeps, the SLURM daemons, the MLflow server, the browser, the fault tests (tests/faults). The full
# suite (.ci/run) runs them all.
SLOW_DIRS = ("e2e", "sweeps", "launchers", "browser", "faults")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts and parts[0] in SLOW_DIRS:
            item.add_marker(pytest.mark.slow)
