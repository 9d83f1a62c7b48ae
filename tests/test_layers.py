"""The import layers of DESIGN.md hold: `lint-imports` checks the contracts in pyproject.toml ([tool.importlinter]),
so an upward import, a cycle between layers, monarch/mlflow/hydra in a pure layer, monarch imported above the
runtime, or the tracker imported by the actors, the runtime or the config fails here. No two modules import each
other, and no module grows past 400 lines."""

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


def lint_copy(tmp_path, additions: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the package with a line added to each of the named files."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "forge_exp", copy / "forge_exp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "hydra_plugins", copy / "hydra_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    for file, line in additions.items():
        with open(copy / file, "a") as f:
            f.write(f"\n{line}  # noqa\n")
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--no-cache"], cwd=copy, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})


def test_a_broken_contract_is_caught(tmp_path):
    """The check can fail: an upward import (a pure layer importing the apps) breaks the layers contract."""
    r = lint_copy(tmp_path, {"forge_exp/rl/types.py": "from forge_exp.apps import common"})
    assert r.returncode != 0 and "forge_exp.rl.types -> forge_exp.apps.common" in r.stdout, r.stdout[-2000:]


def test_the_forbidden_imports_are_caught(tmp_path):
    """Monarch imported by an app, and the tracker imported by the config, each break their own contract (neither
    is an upward import, so the layers alone would let them through)."""
    r = lint_copy(tmp_path, {"forge_exp/apps/eval.py": "import monarch.actor",
                             "forge_exp/config/enums.py": "import forge_exp.tracking.mlflow"})
    said = " ".join(r.stdout.split())  # (long contract names wrap)
    assert r.returncode != 0 and "2 broken" in said, r.stdout[-3000:]
    assert "the CLI reach Monarch only through the runtime BROKEN" in said, r.stdout[-3000:]
    assert "the runtime and the config never import the tracker BROKEN" in said, r.stdout[-3000:]


def import_cycles(package: str) -> list[set[str]]:
    """The package's modules that import each other, directly or round a loop (any import, function-level too; not
    those under TYPE_CHECKING): the strongly connected components of its import graph."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    edges = {m: graph.find_modules_directly_imported_by(m) & graph.modules for m in graph.modules}
    order, low, stack, cycles = {}, {}, [], []

    def visit(v: str) -> None:  # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                cycles.append(component)

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return cycles


def test_import_cycles_finds_a_loop_through_a_function_level_import(tmp_path, monkeypatch):
    pkg = tmp_path / "loopy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from loopy import b\n")
    (pkg / "b.py").write_text("def f():\n    from loopy import a\n")
    (pkg / "c.py").write_text("from loopy import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("loopy") == [{"loopy.a", "loopy.b"}]


def test_no_two_modules_import_each_other():
    """STYLE 10: no cycles. The titan trainer and its checkpoint I/O once did (titan_checkpoint.py takes the trainer
    as an argument and does not import titan.py), and so did models/lora.py's merge CLI with models/hf.py and
    models/checkpoint.py (the CLI is models/merge.py now)."""
    assert import_cycles("forge_exp") == [], "one of these modules holds what belongs to another"


MAX_LINES = 400  # STYLE.md: a file past ~400 lines is asking to be split along a seam that already exists


def test_no_module_of_the_package_is_past_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "forge_exp").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these along a seam: {long}"
