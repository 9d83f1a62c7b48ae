"""The sweep as a person sees it in the MLflow UI: Debian's chromium (headless, driven by playwright-core from
tests/browser/mlflow_ui.mjs) against the real `mlflow server` holding the suite's SLURM sweep. Screenshots are kept
in tests/browser/artifacts/ (git-ignored)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

HERE = Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts"
CHROMIUM = "/usr/bin/chromium"
PARAMS = ("algorithm.loss.beta", "algorithm.loss.clip_low", "algorithm.loss.clip_high")


def test_compare_page_and_runs_table_show_the_sweep(slurm_sweep, tmp_path):
    missing = [what for what, ok in (
        ("chromium (apt-get install chromium)", Path(CHROMIUM).exists()),
        ("node", shutil.which("node") is not None),
        ("playwright-core (npm install in tests/browser)", (HERE / "node_modules" / "playwright-core").is_dir()),
    ) if not ok]  # fmt: skip
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: bash launchers/setup.sh --test installs them")

    client = MlflowClient(slurm_sweep.uri)
    parent = client.get_run(slurm_sweep.parent_run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    ARTIFACTS.mkdir(exist_ok=True)
    check = {
        "uri": slurm_sweep.uri,
        "experimentId": parent.info.experiment_id,
        "parentName": parent.info.run_name,
        "runs": [{"id": r.info.run_id, "name": r.info.run_name, "params": {k: r.data.params[k] for k in PARAMS}}
                 for r in children],
        "out": str(ARTIFACTS),
    }
    assert len({r["name"] for r in check["runs"]}) == 4, "the children need distinct names to be found in the table"
    (tmp_path / "check.json").write_text(json.dumps(check))
    proc = subprocess.run(["node", str(HERE / "mlflow_ui.mjs"), str(tmp_path / "check.json")], cwd=HERE,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n(screenshot: {ARTIFACTS / 'failure.png'})"
    assert all("=" in r["name"] for r in check["runs"]), "children are named by their swept values"
    for name in ("landing.png", "compare-runs.png", "runs-table.png"):
        assert (ARTIFACTS / name).stat().st_size > 20_000, f"{name} looks blank"
