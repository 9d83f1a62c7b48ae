"""Composing the config as the CLI does (aliases expanded), without running anything."""

from __future__ import annotations

import subprocess
import sys

from hydra import compose, initialize_config_module

from forge_exp.config.aliases import expand
from forge_exp.config.store import register
from tests.conftest import CONF, ROOT

register()


def compose_cfg(*overrides: str):
    with initialize_config_module(config_module="forge_exp.conf", version_base=None):
        return compose(config_name="config", overrides=expand(list(overrides)))


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
