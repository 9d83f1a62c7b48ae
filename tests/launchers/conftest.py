"""The helpers that tests/launchers' tests import. The fixtures (slurm_cluster, slurm_env, mlflow_server) live in
fixtures.py, a plugin that tests/conftest.py loads for the whole suite (tests/sweeps and tests/browser use them too)."""

from tests.launchers.fixtures import (  # noqa: F401
    MLFLOW_SH, SBIN_PATH, SLURM_DIR, live_processes, pid_alive, process_group, run_script, slurm_environ,
    start_cluster, start_env,
)
