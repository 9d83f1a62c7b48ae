"""The `logger` group: MLflow by default, several options at once, each its own node typed by its schema, and a
selection without MLflow refused in one line before anything starts."""

from __future__ import annotations

import pytest

from forge_exp.config.logger import LOGGER_SCHEMAS, extra_loggers
from forge_exp.config.validate import ConfigError, validate
from tests.config.helpers import compose_cfg, error_lines, options, run_cli


def test_the_default_is_mlflow_alone():
    config = validate(compose_cfg())
    assert list(config.logger) == ["mlflow"] and extra_loggers(config.logger) == {}


@pytest.mark.parametrize("option", options("logger"))
def test_each_option_composes_beside_mlflow_into_its_schema(option):
    config = validate(compose_cfg(f"logger=[{','.join(dict.fromkeys(['mlflow', option]))}]"))
    assert isinstance(config.logger[option], LOGGER_SCHEMAS[option]) and config.logger[option].name == option


def test_all_three_at_once_each_in_its_own_node():
    config = validate(compose_cfg("logger=[mlflow,tensorboard,wandb]", "logger.wandb.project=mine"))
    assert list(config.logger) == ["mlflow", "tensorboard", "wandb"]
    assert list(extra_loggers(config.logger)) == ["tensorboard", "wandb"]
    assert config.logger["wandb"].project == "mine" and config.logger["tensorboard"].log_dir is None


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["logger=tensorboard"], r"^logger must include mlflow, the run record .*: use logger=\[mlflow,tensorboard\], "
                                 r"got \[tensorboard\]$"),
        (["logger=[wandb,tensorboard]"], r"^logger must include mlflow.*use logger=\[mlflow,wandb,tensorboard\]"),
        (["logger=[mlflow,tensorboard]", "logger.tensorboard.flush_secs=0"],
         r"^logger\.tensorboard\.flush_secs must be >= 1, got 0$"),
        (["logger=[mlflow,wandb]", "+logger.wandb.mode=online"], r"^logger\.wandb\.mode is not a config key"),
        (["+logger.foo.x=1"], r"^logger\.foo is not a logger; choose among conf/logger/"),
    ],
)
def test_bad_selections_and_keys_are_one_error_naming_logger(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        validate(compose_cfg(*overrides))
    assert "\n" not in str(e.value)


def test_the_cli_prints_the_group_and_refuses_a_run_without_mlflow(tmp_path):
    r = run_cli("logger=[mlflow,tensorboard,wandb]", "--cfg", "job", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    shown = r.stdout[r.stdout.index("\nlogger:"):]
    for line in ("  mlflow:\n    name: mlflow", "  tensorboard:\n    _target_: forge_exp.tracking.loggers.TensorBoard",
                 "  wandb:\n    _target_: forge_exp.tracking.loggers.Wandb"):
        assert line in shown, r.stdout
    for args, expected in {
        ("logger=[tensorboard]",): "logger must include mlflow",
        ("logger=[mlflow,tensorboard]", "logger.tensorboard.logdir=x"): "logger.tensorboard.logdir is not a config "
                                                                        "key; did you mean logger.tensorboard.log_dir?",
        ("logger=[mlflow,tensorbord]",): "logger=tensorbord is not an option; did you mean logger=tensorboard?",
    }.items():
        r = run_cli(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
        err = error_lines(r)
        assert r.returncode == 2 and len(err) == 1, (args, r.stderr)
        assert err[0].startswith(f"forge-exp: error: {expected}"), (args, r.stderr)
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "run" / "tensorboard").exists()
