"""From the `services` config to a plan of proc meshes and devices. Pure: no processes are started here,
so the GPU assignment can be tested on a machine without GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field

from forge_exp.config.services import ServicesConfig

# GPUs are handed out in this order, so `services=three_gpu` puts the trainer on GPU 0, the reference
# model on GPU 1 and the generator on GPU 2.
GPU_ORDER = ("trainer", "ref_model", "generator", "reward", "env", "dataset", "replay_buffer")


@dataclass
class MeshPlan:
    name: str
    services: list[str]
    replicas: int
    procs: int
    gpus: int  # per process
    threads: int
    first_gpu: int = 0
    devices: list[list[str]] = field(default_factory=list)  # [replica][proc] -> "cpu" | "cuda:N"
    # processes started per replica: `procs`, or 1 when that one process drives all of its replica's devices itself
    # (vLLM's tensor-parallel workers); the actor still receives every device of its replica
    spawn_procs: int = 0

    def __post_init__(self) -> None:
        self.spawn_procs = self.spawn_procs or self.procs

    @property
    def num_gpus(self) -> int:
        return self.replicas * self.procs * self.gpus


def needed_services(beta: float, multi_turn: bool = False) -> set[str]:
    """The services a run uses: the reference model only when the KL term is on; environment workers (which score
    their own episodes) instead of reward workers for a multi-turn environment."""
    unused = ({"ref_model"} if beta == 0 else set()) | ({"reward"} if multi_turn else {"env"})
    return set(GPU_ORDER) - unused


def plan_meshes(services: ServicesConfig, needed: set[str] | None = None,
                drives_workers: frozenset[str] = frozenset()) -> dict[str, MeshPlan]:
    """Group services into proc meshes and assign devices. `needed` leaves out services that this run does not
    use (the reference model when beta == 0); a service in `drives_workers` gets one process per replica that is
    handed all its replica's devices (its engine starts its own workers)."""
    needed = set(GPU_ORDER) if needed is None else needed
    meshes: dict[str, MeshPlan] = {}
    for name in GPU_ORDER:
        if name not in needed:
            continue
        spec = getattr(services, name)
        mesh_name = spec.mesh or name
        plan = meshes.get(mesh_name)
        if plan is None:
            meshes[mesh_name] = MeshPlan(mesh_name, [name], spec.replicas, spec.procs, spec.gpus, spec.threads,
                                         spawn_procs=1 if name in drives_workers else spec.procs)
            continue
        for key in ("replicas", "procs", "gpus"):
            if getattr(spec, key) != getattr(plan, key):
                raise ValueError(
                    f"services.{name}.{key}={getattr(spec, key)} differs from {getattr(plan, key)} of "
                    f"services.{plan.services[0]}, which shares mesh '{mesh_name}': colocated services must agree"
                )
        plan.services.append(name)
        plan.threads = max(plan.threads, spec.threads)
    next_gpu = 0
    for plan in meshes.values():
        plan.first_gpu = next_gpu
        plan.devices = [
            [
                f"cuda:{next_gpu + r * plan.procs + p}" if plan.gpus else "cpu"
                for p in range(plan.procs)
            ]
            for r in range(plan.replicas)
        ]
        next_gpu += plan.num_gpus
    return meshes


def plan_for(config) -> dict[str, MeshPlan]:
    """The meshes of a run: its services layout, the services it uses, and which engines drive their own workers."""
    drives = frozenset({"generator"}) if getattr(config.generator, "drives_workers", False) else frozenset()
    return plan_meshes(config.services, needed_services(config.algorithm.beta, config.env.multi_turn), drives)


def gpus_needed(meshes: dict[str, MeshPlan]) -> int:
    return sum(p.num_gpus for p in meshes.values())


def check_gpus(meshes: dict[str, MeshPlan], available: int) -> None:
    need = gpus_needed(meshes)
    if need > available:
        layout = ", ".join(f"{m.name}={m.num_gpus}" for m in meshes.values() if m.num_gpus)
        raise ValueError(
            f"services needs {need} GPUs ({layout}) but {available} are visible: "
            f"choose a smaller services= layout or run on a machine with more GPUs"
        )


def device_of(meshes: dict[str, MeshPlan], service: str) -> list[list[str]]:
    for plan in meshes.values():
        if service in plan.services:
            return plan.devices
    raise KeyError(service)
