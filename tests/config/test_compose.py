"""Every config composes into the typed schema; bad values fail before any process starts, naming the key."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from forge_exp.config.store import register
from forge_exp.config.validate import validate
from tests.conftest import CONF, ROOT

register()
GROUPS = ["model", "algorithm", "reward", "dataset", "parallelism", "services"]


def compose_cfg(*overrides: str):
    with initialize_config_module(config_module="forge_exp.conf", version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_into_the_schema(group, option):
    cfg = compose_cfg(f"{group}={option}")
    typed = OmegaConf.to_object(cfg)
    assert getattr(typed, group).name == option


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(experiment):
    OmegaConf.to_object(compose_cfg(f"experiment={experiment}"))


def test_default_passes_full_validation():
    config = validate(compose_cfg())
    assert config.model.source == "tiny" and config.algorithm.name == "grpo"


@pytest.mark.parametrize(
    "override,message",
    [
        ("algorithm.beta=-0.1", "algorithm.beta"),
        ("algorithm.clip_low=1.0", "algorithm.clip_low"),
        ("algorithm.group_size=1", "algorithm.group_size"),
        ("services=three_gpu", r"services needs 2 GPUs \(trainer=1, generator=1\) but 0 are visible"),
        ("dataset.max_new_tokens=0", "dataset.max_new_tokens"),
        ("steps=0", "steps"),
    ],
)
def test_out_of_range_values_are_one_clear_error(override, message):
    with pytest.raises(ValueError, match=message):
        validate(compose_cfg(override))


def test_unknown_keys_and_wrong_types_fail_at_compose_time():
    with pytest.raises(Exception, match="betaa"):
        compose_cfg("algorithm.betaa=0.1")
    with pytest.raises(Exception, match="group_size"):
        compose_cfg("algorithm.group_size=eight")


def run_cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forge_exp.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_cli_bad_value_prints_one_line_naming_the_key_and_spawns_nothing():
    r = run_cli("algorithm.clip_low=1.5", "hydra.run.dir=/tmp/forge-exp-test-bad")
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert err == [err[0]] and err[0].startswith("forge-exp: error: algorithm.clip_low"), r.stderr
    assert "monarch" not in r.stdout + r.stderr.lower()


def test_cli_unknown_key_names_it():
    r = run_cli("algorithm.betaa=0.1")
    assert r.returncode != 0 and "betaa" in r.stderr


def test_real_model_config_prints_and_fails_clearly_without_weights(tmp_path):
    r = run_cli("algorithm=grpo", "model=qwen3_1_7b", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "hf_id: Qwen/Qwen3-1.7B" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "forge_exp.cli", "algorithm=grpo", "model=qwen3_1_7b", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**_env(), "HF_HOME": str(tmp_path / "hf")},
    )
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "model.path" in err[0] and "Qwen/Qwen3-1.7B" in err[0], r.stderr


def _env() -> dict:
    import os

    return dict(os.environ)
