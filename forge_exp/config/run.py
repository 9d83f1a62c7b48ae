"""The root config: the groups, plus what belongs to the run itself (steps, warm start, evaluation, tracking).

The groups whose options differ in shape (model, algorithm, dataset, trainer, generator, env, cluster) are typed here
by the base their options' schemas share, and each option by its own schema, named in that YAML's defaults list
(`- /schema/model/tiny@_here_`): OmegaConf merges a subclass into a node typed by its base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import MISSING

from forge_exp.checks import FieldError, at_least, seed, within
from forge_exp.config.algorithm import AlgorithmBase
from forge_exp.config.backends import TrainerBackend
from forge_exp.config.cluster import ClusterBase
from forge_exp.config.dataset import DatasetBase
from forge_exp.config.env import EnvBase
from forge_exp.config.logger import check_loggers
from forge_exp.config.model import ModelBase
from forge_exp.config.reward import RewardConfig
from forge_exp.config.services import ParallelismConfig, ServicesConfig
from forge_exp.generators.options import EngineOptions


@dataclass
class EvalConfig:
    every: int = 0  # steps between held-out evaluations; 0 = only at the start and the end
    pass_k: int = 0  # > 1: also pass@k with k samples at `temperature`
    temperature: float = 0.7

    def __post_init__(self) -> None:
        at_least("every", self.every, 0)
        if self.pass_k == 1 or self.pass_k < 0:
            raise FieldError("pass_k", f"must be 0 (off) or >= 2 (pass@k needs several samples), got {self.pass_k}")
        within("temperature", self.temperature, 0, float("inf"), low_open=True)


@dataclass
class CheckpointConfig:
    every: int = 0  # steps between training checkpoints (weights + optimizer + step); 0 = none
    dir: Optional[str] = None  # default: <run output dir>/checkpoints
    keep: int = 2  # newest checkpoints kept
    # on SIGTERM / SIGUSR2 / Ctrl-C: seconds to let the step in flight finish and checkpoint it (with every > 0);
    # past that the run stops without one. Keep it under the time SLURM gives between SIGTERM and SIGKILL (KillWait).
    stop_grace_s: float = 20.0

    def __post_init__(self) -> None:
        at_least("every", self.every, 0)
        at_least("keep", self.keep, 1)
        at_least("stop_grace_s", self.stop_grace_s, 0)


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI, else sqlite under ./mlruns
    experiment: str = "forge-exp"
    run_name: Optional[str] = None
    parent_run_id: Optional[str] = None  # set by sweeps: this run becomes a child of the sweep's parent run
    close_wait_s: float = 60.0  # at the end, how long to keep trying a store that does not answer (docs/reliability.md)

    def __post_init__(self) -> None:
        at_least("close_wait_s", self.close_wait_s, 0)
        if not self.experiment.strip():
            raise FieldError("experiment", "must be a name (MLflow refuses an empty one), got "
                                           f"{self.experiment!r}")


@dataclass
class ForgeConfig:
    name: str = "default"
    mode: str = "train"  # train | eval
    seed: int = 0
    steps: int = 100  # optimizer steps of the RL (or SFT) phase
    progress: bool = True
    output_dir: Optional[str] = None  # None: the Hydra run directory
    # (dataset before algorithm: a loss knob interpolates dataset.max_new_tokens, so a bad value is reported where
    # it was written)
    model: ModelBase = MISSING  # config/model.py
    dataset: DatasetBase = MISSING  # config/dataset.py
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmBase = MISSING  # config/algorithm.py
    trainer: TrainerBackend = MISSING  # config/backends.py
    generator: EngineOptions = MISSING  # generators/options.py
    env: EnvBase = MISSING  # config/env.py
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    cluster: ClusterBase = MISSING  # config/cluster.py: where the meshes' hosts come from (this host, or SLURM)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    # config/logger.py: logger.<name> per chosen option (MLflow and any others); empty here, as the defaults list
    # names mlflow (a default entry would join every selection). Any, not a logger base: OmegaConf refuses a typed
    # value (`+logger.foo.x=1`) inside Hydra's merge, before validate can name the logger options
    logger: Dict[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: bool = False  # continue from the newest checkpoint in checkpoint.dir, into the same MLflow run

    @property
    def reference_service(self) -> bool:
        """Whether the KL term's reference model is a service of its own (services.ref_model): not without the term,
        nor with LoRA (the trainer's base with its adapters off), nor when the trainer hosts it."""
        return self.algorithm.needs_reference and self.model.lora.rank is None and not self.trainer_hosts_reference

    @property
    def trainer_hosts_reference(self) -> bool:
        """trainer.hosts_reference as this run resolves it (null: when a reference service would share the trainer's
        mesh); False for an engine without the knob."""
        hosts = getattr(self.trainer, "hosts_reference", False)
        if hosts is None:
            services = self.services
            return (services.ref_model.mesh or "ref_model") == (services.trainer.mesh or "trainer")
        return hosts

    def __post_init__(self) -> None:
        at_least("steps", self.steps, 1)
        seed("seed", self.seed)
        check_loggers(self.logger)
        if self.mode not in ("train", "eval"):
            raise FieldError("mode", f"must be train or eval, got {self.mode!r}")
        self.algorithm.check_with(self.dataset, self.env, self.generator)
        if self.services.generator.procs > 1 and not self.generator.drives_workers:
            raise FieldError("services.generator.procs", f"must be 1 for generator={self.generator.name} (one process "
                             f"per replica; got {self.services.generator.procs}): add replicas with "
                             f"services.generator.replicas, or use generator=vllm for tensor parallelism")
        procs = self.services.trainer.procs
        if not self.trainer.collective:
            if procs > 1:
                raise FieldError("services.trainer.procs", f"must be 1 for trainer={self.trainer.name}, which runs "
                                 f"one process (got {procs}); sharded training is trainer=titan")
            if self.parallelism.name.value != "single":
                raise FieldError(f"parallelism={self.parallelism.name.value} needs trainer=titan (trainer="
                                 f"{self.trainer.name} holds the whole model in one process)")
        self.parallelism.degrees(procs)
        if self.algorithm.app == "sft" and not self.trainer.sft:
            raise FieldError(f"trainer={self.trainer.name} trains the GRPO family; algorithm=sft runs on "
                             f"trainer=hf")
        rank = self.model.lora.rank
        if rank is not None and not self.trainer.lora:
            raise FieldError(f"model.lora.rank={rank}: trainer={self.trainer.name} trains every parameter (no "
                             f"adapters); LoRA runs on trainer=hf, or set model.lora.rank=null")
