"""Configs ship inside the package: a regular (non-editable) install composes the same configs and sweeps."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from tests.conftest import ROOT


def test_wheel_carries_configs_and_composes_outside_the_checkout(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
         str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("forge_exp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for path in ("forge_exp/conf/config.yaml", "forge_exp/conf/model/qwen3_1_7b.yaml",
                 "forge_exp/conf/algorithm/dapo.yaml", "forge_exp/sweeps/sweep/grpo_beta_clip.yaml"):
        assert path in names, path
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # run from an unrelated directory with the installed copy first on the path: no file of the checkout is used
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run(
        [sys.executable, "-c", "import forge_exp, sys; print(forge_exp.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert r.stdout.strip().startswith(str(site)), r.stdout + r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "forge_exp.cli", "algorithm=dapo", "model=qwen3_1_7b", "+sweep=grpo_beta_clip",
         "--cfg", "job"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "hf_id: Qwen/Qwen3-1.7B" in r.stdout and "name: dapo" in r.stdout


def test_every_config_folder_is_a_listed_package():
    """Each folder of conf/ and sweeps/ ships as a data package: one missing from pyproject is left out of a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for root, prefix in (("conf", "forge_exp.conf"), ("sweeps", "forge_exp.sweeps")):
        for folder in [ROOT / root, *(p for p in (ROOT / root).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            name = ".".join([prefix, *folder.relative_to(ROOT / root).parts])
            assert name in listed, f"{name} is missing from [tool.setuptools] packages in pyproject.toml"


def test_every_python_package_is_listed():
    """A new subpackage of forge_exp missing from pyproject is left out of a regular install (an installed
    `forge-exp` then fails at its first import of it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for init in (ROOT / "forge_exp").rglob("__init__.py"):
        name = ".".join(init.parent.relative_to(ROOT).parts)
        if not name.startswith(("forge_exp.conf", "forge_exp.sweeps")):
            assert name in listed, f"{name} is missing from [tool.setuptools] packages in pyproject.toml"
