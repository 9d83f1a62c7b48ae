"""The root config: the groups, plus what belongs to the run itself (steps, warm start, evaluation, tracking)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


from forge_exp.config.algorithm import AlgorithmConfig
from forge_exp.config.dataset import DatasetConfig
from forge_exp.config.model import ModelConfig
from forge_exp.config.reward import RewardConfig
from forge_exp.config.services import ParallelismConfig, ServicesConfig


@dataclass
class WarmstartConfig:
    """Supervised steps on the task before RL, for a randomly initialised model (model.source=tiny without
    model.path) that could not otherwise earn any reward; pretrained models start RL as they are. Cached by a hash of
    model, dataset and these settings, so a second run starts from it."""

    steps: int = 0  # step budget; 0 = no warm start
    lr: float = 1e-3
    batch_size: int = 64
    target_accuracy: Optional[float] = None  # stop once this fraction of training answers is exact (leaves RL room)
    cache_dir: Optional[str] = None  # default ~/.cache/forge-exp/warmstart

    def __post_init__(self) -> None:
        _at_least("warmstart.steps", self.steps, 0)
        _at_least("warmstart.batch_size", self.batch_size, 1)
        if not self.lr > 0:
            raise ValueError(f"warmstart.lr must be > 0, got {self.lr}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"warmstart.target_accuracy must be in (0, 1] or null, got {self.target_accuracy}")


@dataclass
class EvalConfig:
    every: int = 0  # steps between held-out evaluations; 0 = only at the start and the end
    pass_k: int = 0  # > 1: also pass@k with k samples at `temperature`
    temperature: float = 0.7

    def __post_init__(self) -> None:
        _at_least("eval.every", self.every, 0)
        _at_least("eval.pass_k", self.pass_k, 0)


@dataclass
class CheckpointConfig:
    every: int = 0  # steps between training checkpoints (weights + optimizer + step); 0 = none
    dir: Optional[str] = None  # default: <run output dir>/checkpoints
    keep: int = 2  # newest checkpoints kept

    def __post_init__(self) -> None:
        _at_least("checkpoint.every", self.every, 0)
        _at_least("checkpoint.keep", self.keep, 1)


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI, else sqlite under ./mlruns
    experiment: str = "forge-exp"
    run_name: Optional[str] = None
    parent_run_id: Optional[str] = None  # set by sweeps: this run becomes a child of the sweep's parent run


@dataclass
class ForgeConfig:
    name: str = "default"
    mode: str = "train"  # train | eval
    seed: int = 0
    steps: int = 100  # optimizer steps of the RL (or SFT) phase
    progress: bool = True
    output_dir: Optional[str] = None  # None: the Hydra run directory
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: bool = False  # continue from the newest checkpoint in checkpoint.dir, into the same MLflow run

    def __post_init__(self) -> None:
        _at_least("steps", self.steps, 1)
        if self.mode not in ("train", "eval"):
            raise ValueError(f"mode must be train or eval, got {self.mode!r}")


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"{key} must be >= {low}, got {value}")
