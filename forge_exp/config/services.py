"""Where each service runs: proc meshes, replicas, GPUs. Never mentions learning rates (STYLE 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from forge_exp.checks import FieldError, at_least
from forge_exp.choices import Parallelism

SERVICES = ("dataset", "generator", "reward", "env", "ref_model", "trainer", "replay_buffer")
# The mesh name that means "in the controller's own process" (no process of its own): for light services, whose
# process would cost ~250 MiB and seconds of start-up for microseconds of work a step (benchmarks/lean.md).
CONTROLLER = "controller"


@dataclass
class ServiceSpec:
    """One service. Services that name the same `mesh` share its processes (colocation)."""

    mesh: str = ""  # proc mesh to live on; "" = a mesh of its own, named after the service
    procs: int = 1  # processes per replica
    replicas: int = 1  # independent copies (generators, reward and environment workers scale this way)
    in_flight: int = 1  # calls a replica serves at once (the generator batches them: more rows per decode step)
    gpus: int = 0  # GPUs per process: 0 (CPU) or 1
    threads: int = 1  # torch intra-op threads per process


@dataclass
class ServicesConfig:
    name: str = "cpu"
    dataset: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))
    generator: ServiceSpec = field(default_factory=ServiceSpec)
    reward: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))
    env: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))  # multi-turn environment workers
    ref_model: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="trainer"))
    trainer: ServiceSpec = field(default_factory=ServiceSpec)
    replay_buffer: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))

    def spec(self, name: str) -> ServiceSpec:
        """The spec of the service `name`, one of SERVICES."""
        if name not in SERVICES:
            raise KeyError(f"no service {name!r}: the services are {', '.join(SERVICES)}")
        return getattr(self, name)

    def __post_init__(self) -> None:
        for name in SERVICES:
            spec = self.spec(name)
            for key in ("procs", "replicas", "threads", "in_flight"):
                at_least(f"{name}.{key}", getattr(spec, key), 1)
            if spec.gpus not in (0, 1):
                raise FieldError(f"{name}.gpus", f"must be 0 or 1 (GPUs per process), got {spec.gpus}")
        for name in ("trainer", "ref_model", "dataset", "replay_buffer"):
            if self.spec(name).replicas != 1:
                raise FieldError(f"{name}.replicas", "must be 1 (only generator, reward and env replicate)")
        for name in SERVICES:
            if name not in ("trainer", "generator") and self.spec(name).procs != 1:
                # a generator replica is one process today; a tensor-parallel generator (vLLM) would take more
                raise FieldError(f"{name}.procs", f"must be 1: one process per replica (scale {name} with "
                                                  f"services.{name}.replicas where it replicates)")
        for name in SERVICES:
            spec = self.spec(name)
            if spec.mesh == CONTROLLER and (spec.replicas, spec.procs, spec.gpus) != (1, 1, 0):
                raise FieldError(f"{name}.mesh", f"'{CONTROLLER}' runs the service in the controller's process: "
                                                 "it needs replicas=1, procs=1, gpus=0; give it a mesh of its own")


@dataclass
class ParallelismConfig:
    """How the trainer shards its model over its processes (services.trainer.procs = dp_replicate × dp_shard × tp;
    trainers/parallel.py, docs/titan.md). Only trainer=titan shards: trainer=hf is `single`."""

    name: Parallelism = Parallelism.single  # single | fsdp | tp | fsdp_tp (fsdp with data_parallel_replicate > 1: HSDP)
    data_parallel_shard: Optional[int] = None  # FSDP degree; null: what procs leave after tp and replicate
    tensor_parallel: int = 1
    data_parallel_replicate: int = 1  # HSDP: replicate across groups that each shard

    def __post_init__(self) -> None:
        for key in ("tensor_parallel", "data_parallel_replicate"):
            at_least(key, getattr(self, key), 1)
        if self.data_parallel_shard is not None:
            at_least("data_parallel_shard", self.data_parallel_shard, 1)
        if self.name in (Parallelism.single, Parallelism.fsdp) and self.tensor_parallel != 1:
            raise FieldError("tensor_parallel", f"must be 1 for parallelism={self.name.value} (got "
                             f"{self.tensor_parallel}): choose parallelism=tp or fsdp_tp")
        if self.name in (Parallelism.single, Parallelism.tp) and self.data_parallel_replicate != 1:
            raise FieldError("data_parallel_replicate", f"must be 1 for parallelism={self.name.value}: HSDP is "
                             "parallelism=fsdp (or fsdp_tp) with data_parallel_replicate > 1")

    def degrees(self, procs: int):
        """trainers.parallel.Degrees on `procs` trainer processes, or FieldError naming the keys."""
        from forge_exp.trainers.parallel import degrees

        name = self.name.value
        if name == "tp" and self.tensor_parallel not in (1, procs):
            raise FieldError("parallelism.tensor_parallel", f"must be services.trainer.procs={procs} (or 1: the "
                             f"same) for parallelism=tp, got {self.tensor_parallel}")
        try:
            d = degrees(name, procs, self.tensor_parallel, self.data_parallel_replicate)
        except ValueError as e:
            raise FieldError(str(e)) from None
        if self.data_parallel_shard is not None and self.data_parallel_shard != d.dp_shard:
            raise FieldError(f"parallelism.data_parallel_shard={self.data_parallel_shard} does not fit "
                             f"services.trainer.procs={procs}: procs = data_parallel_replicate × data_parallel_shard "
                             f"× tensor_parallel ({d.dp_replicate} × {d.dp_shard} × {d.tp})")
        return d
