"""The import layers of DESIGN.md hold: `lint-imports` checks the contracts in pyproject.toml ([tool.importlinter]),
so an upward import, a cycle between layers, or monarch/mlflow/hydra in a pure layer fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_import_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_a_broken_contract_is_caught(tmp_path):
    """The check can fail: an upward import (a pure layer importing the apps) breaks the layers contract."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "forge_exp", copy / "forge_exp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "hydra_plugins", copy / "hydra_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    with open(copy / "forge_exp" / "rl" / "types.py", "a") as f:
        f.write("\nfrom forge_exp.apps import common  # noqa\n")
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], cwd=copy, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "forge_exp.rl.types -> forge_exp.apps.common" in r.stdout, r.stdout[-2000:]
