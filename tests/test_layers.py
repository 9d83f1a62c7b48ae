"""The import layers of DESIGN.md hold: `lint-imports` checks the contracts in pyproject.toml ([tool.importlinter]),
so an upward import, a cycle between layers, monarch/mlflow/hydra in a pure layer, monarch imported above the
runtime, or the tracker imported by the actors, the runtime or the config fails here. And no module grows past
400 lines."""

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


MAX_LINES = 400  # STYLE.md: a file past ~400 lines is asking to be split along a seam that already exists


def test_no_module_of_the_package_is_past_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "forge_exp").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these along a seam: {long}"
