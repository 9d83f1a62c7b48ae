"""Schemas of the `logger` group: where a run's metrics, params and config go. Several may be chosen at once
(`logger=[mlflow,tensorboard,wandb]`); each option is its own node, `logger.<name>` (`# @package logger.<name>`).

    logger=mlflow        the run record (the default): its store and experiment are `tracking.*` (config/run.py)
    logger=tensorboard   event files for `tensorboard --logdir` (torch's SummaryWriter)
    logger=wandb         a Weights & Biases run in offline mode: files to upload later with `wandb sync`

MLflow cannot be left out: resume finds its run there, a sweep's parent run holds its jobs' runs, and a failed run's
status is set there. The others are fed on the tracker's thread what MLflow is fed (forge_exp/tracking/loggers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from forge_exp.checks import FieldError, at_least


@dataclass
class MlflowConfig:
    """conf/logger/mlflow.yaml: the MLflow tracker itself (tracking/mlflow.py), always on; `tracking.*` says where."""

    name: str = "mlflow"


@dataclass
class TensorBoardConfig:
    """conf/logger/tensorboard.yaml: scalars at the step MLflow has them, params and the resolved config as text."""

    _target_: str = "forge_exp.tracking.loggers.TensorBoard"
    name: str = "tensorboard"
    log_dir: Optional[str] = None  # null: <run output dir>/tensorboard
    flush_secs: int = 30  # SummaryWriter writes its buffer this often (and at the end)

    def __post_init__(self) -> None:
        at_least("flush_secs", self.flush_secs, 1)


@dataclass
class WandbConfig:
    """conf/logger/wandb.yaml: always offline (no network is assumed); `wandb sync <dir>/wandb/offline-run-*`
    uploads a run later. Its run id is the MLflow run's id."""

    _target_: str = "forge_exp.tracking.loggers.Wandb"
    name: str = "wandb"
    project: Optional[str] = None  # null: the MLflow experiment's name (tracking.experiment)
    dir: Optional[str] = None  # where wandb/offline-run-* is written; null: the run output dir


LOGGER_SCHEMAS = {"mlflow": MlflowConfig, "tensorboard": TensorBoardConfig, "wandb": WandbConfig}


def extra_loggers(loggers: Mapping[str, Any]) -> dict[str, Any]:
    """The chosen loggers other than MLflow, by name: each built from its `_target_` (tracking/loggers.py)."""
    return {name: node for name, node in loggers.items() if getattr(node, "_target_", None)}


def check_loggers(loggers: Mapping[str, Any]) -> None:
    """The run record is MLflow's: a selection without it is refused before anything starts."""
    if not any(isinstance(node, MlflowConfig) for node in loggers.values()):
        chosen = ",".join(loggers) or "none"
        raise FieldError("logger", f"must include mlflow, the run record (resume, sweeps and a failed run's status "
                                   f"live there): use logger=[mlflow,{chosen}], got [{chosen}]")
