"""Where each service runs: proc meshes, replicas, GPUs. Never mentions learning rates (STYLE 5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from forge_exp.config.checks import FieldError, at_least

SERVICES = ("dataset", "generator", "reward", "ref_model", "trainer", "replay_buffer")
# The mesh name that means "in the controller's own process" (no process of its own): for light services, whose
# process would cost ~250 MiB and seconds of start-up for microseconds of work a step (benchmarks/lean.md).
CONTROLLER = "controller"


@dataclass
class ServiceSpec:
    """One service. Services that name the same `mesh` share its processes (colocation)."""

    mesh: str = ""  # proc mesh to live on; "" = a mesh of its own, named after the service
    procs: int = 1  # processes per replica
    replicas: int = 1  # independent copies (generators and reward workers scale this way)
    gpus: int = 0  # GPUs per process: 0 (CPU) or 1
    threads: int = 1  # torch intra-op threads per process


@dataclass
class ServicesConfig:
    name: str = "cpu"
    dataset: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))
    generator: ServiceSpec = field(default_factory=ServiceSpec)
    reward: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))
    ref_model: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="trainer"))
    trainer: ServiceSpec = field(default_factory=ServiceSpec)
    replay_buffer: ServiceSpec = field(default_factory=lambda: ServiceSpec(mesh="host"))

    def __post_init__(self) -> None:
        for name in SERVICES:
            spec = getattr(self, name)
            for key in ("procs", "replicas", "threads"):
                at_least(f"{name}.{key}", getattr(spec, key), 1)
            if spec.gpus not in (0, 1):
                raise FieldError(f"{name}.gpus", f"must be 0 or 1 (GPUs per process), got {spec.gpus}")
        for name in ("trainer", "ref_model", "dataset", "replay_buffer"):
            if getattr(self, name).replicas != 1:
                raise FieldError(f"{name}.replicas", "must be 1 (only generator and reward replicate)")
        for name in SERVICES:
            if name != "trainer" and getattr(self, name).procs != 1:
                # a generator replica is one process today; a tensor-parallel generator (vLLM) would take more
                raise FieldError(f"{name}.procs", f"must be 1: one process per replica (scale {name} with "
                                                  f"services.{name}.replicas where it replicates)")
        for name in SERVICES:
            spec = getattr(self, name)
            if spec.mesh == CONTROLLER and (spec.replicas, spec.procs, spec.gpus) != (1, 1, 0):
                raise FieldError(f"{name}.mesh", f"'{CONTROLLER}' runs the service in the controller's process: "
                                                 "it needs replicas=1, procs=1, gpus=0; give it a mesh of its own")


@dataclass
class ParallelismConfig:
    """How one service shards its model. Only `single` (one process, whole model) runs today."""

    name: str = "single"
    data_parallel_shard: int = 1
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        for key in ("data_parallel_shard", "tensor_parallel"):
            if getattr(self, key) != 1:
                raise FieldError(key, f"must be 1 (got {getattr(self, key)}): sharding is not supported yet, use "
                                      "parallelism=single")
