"""From the `services` config to a plan of proc meshes and devices. Pure: no processes are started here,
so the GPU assignment can be tested on a machine without GPUs.

A mesh that `cluster.hosts` puts on N nodes of a cluster allocation (`nodes` = N; 0 = this host) spreads evenly over
them: its replicas when N divides them, else (one replica) its procs. Each of its hosts numbers its GPUs from 0; the
meshes on this host share this host's GPUs, in GPU_ORDER."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from forge_exp.config.services import CONTROLLER, ServicesConfig

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
    nodes: int = 0  # hosts of the cluster allocation this mesh spans (cluster.hosts); 0: this host

    def __post_init__(self) -> None:
        self.spawn_procs = self.spawn_procs or self.procs

    @property
    def num_gpus(self) -> int:
        return self.replicas * self.procs * self.gpus

    @property
    def per_host(self) -> dict[str, int]:
        """The procs Monarch starts on each of the mesh's hosts: its replicas spread over them, or, with one
        replica on several hosts, its procs."""
        hosts = max(self.nodes, 1)
        if self.replicas % hosts == 0:
            return {"replicas": self.replicas // hosts, "procs": self.spawn_procs}
        return {"replicas": 1, "procs": self.spawn_procs // hosts}

    @property
    def procs_per_host(self) -> int:
        """Processes (devices, for an engine that drives its replica's devices itself) on one of its hosts."""
        return self.replicas * self.procs // max(self.nodes, 1)


SCORERS = {"reward", "env"}  # the services that may score episodes (config/env.py: the env option's scorer)


def needed_services(reference: bool, scorer: str = "reward") -> set[str]:
    """The services a run uses: the reference model when it is a service of its own (`reference`: the config's
    reference_service); of the services that may score episodes, the one the env option names (reward workers, or
    environment workers that score their own episodes)."""
    unused = ({"ref_model"} if not reference else set()) | (SCORERS - {scorer})
    return set(GPU_ORDER) - unused


def plan_meshes(services: ServicesConfig, needed: set[str] | None = None,
                drives_workers: frozenset[str] = frozenset(), hosts: Mapping[str, int] | None = None
                ) -> dict[str, MeshPlan]:
    """Group services into proc meshes and assign devices. `needed` leaves out services that this run does not
    use (the reference model when none is needed); a service in `drives_workers` gets one process per replica that is
    handed all its replica's devices (its engine starts its own workers); `hosts` (cluster.hosts) puts meshes on
    nodes of a cluster allocation."""
    needed = set(GPU_ORDER) if needed is None else needed
    meshes: dict[str, MeshPlan] = {}
    for name in GPU_ORDER:
        if name not in needed:
            continue
        spec = services.spec(name)
        mesh_name = spec.mesh or name
        plan = meshes.get(mesh_name)
        if plan is None:
            meshes[mesh_name] = MeshPlan(mesh_name, [name], spec.replicas, spec.procs, spec.gpus, spec.threads,
                                         spawn_procs=1 if name in drives_workers else spec.procs)
            continue
        for key, mine, shared in (("replicas", spec.replicas, plan.replicas), ("procs", spec.procs, plan.procs),
                                  ("gpus", spec.gpus, plan.gpus)):
            if mine != shared:
                raise ValueError(
                    f"services.{name}.{key}={mine} differs from {shared} of services.{plan.services[0]}, which "
                    f"shares mesh '{mesh_name}': colocated services must agree; give services.{name} a mesh of "
                    f"its own (services.{name}.mesh='') or the same {key}"
                    + (", or with trainer=titan keep the reference in the trainer (trainer.hosts_reference=true)"
                       if name == "ref_model" else "")
                )
        plan.services.append(name)
        plan.threads = max(plan.threads, spec.threads)
    for mesh_name, nodes in (hosts or {}).items():
        _place_on_nodes(meshes, mesh_name, nodes)
    next_gpu = 0
    for plan in meshes.values():
        plan.first_gpu = 0 if plan.nodes else next_gpu  # a mesh on nodes of its own starts at GPU 0 on each
        plan.devices = [
            [
                f"cuda:{plan.first_gpu + (r * plan.procs + p) % plan.procs_per_host}" if plan.gpus else "cpu"
                for p in range(plan.procs)
            ]
            for r in range(plan.replicas)
        ]
        if not plan.nodes:
            next_gpu += plan.num_gpus
    return meshes


def _place_on_nodes(meshes: dict[str, MeshPlan], mesh_name: str, nodes: int) -> None:
    key = f"cluster.hosts.{mesh_name}"
    plan = meshes.get(mesh_name)
    if plan is None:
        raise ValueError(f"{key}: this run has no proc mesh '{mesh_name}' (its meshes: {', '.join(meshes)}); name "
                         f"one of them (a service's mesh is services.<service>.mesh, or the service's own name)")
    if mesh_name == CONTROLLER:
        raise ValueError(f"{key}: the '{CONTROLLER}' mesh is the controller's own process "
                         f"({', '.join(f'services.{s}' for s in plan.services)}), which stays on this host: give those "
                         f"services a mesh of their own (services.<service>.mesh) to put them on the cluster")
    spreads = plan.replicas % nodes == 0 or (plan.replicas == 1 and plan.spawn_procs == plan.procs
                                             and plan.procs % nodes == 0)
    if not spreads:
        raise ValueError(f"{key}={nodes}: mesh '{mesh_name}' has {plan.replicas} replica(s) of {plan.procs} "
                         f"proc(s) ({', '.join(f'services.{s}' for s in plan.services)}), which do not spread evenly "
                         f"over {nodes} hosts: give a node count that divides its replicas (or, for one replica, "
                         f"its procs; a replica whose engine drives its devices itself stays on one host)")
    plan.nodes = nodes


def plan_for(config) -> dict[str, MeshPlan]:
    """The meshes of a run: its services layout, the services it uses, and which engines drive their own workers."""
    drives = frozenset({"generator"}) if config.generator.drives_workers else frozenset()
    needed = needed_services(config.reference_service, config.env.scorer)
    return plan_meshes(config.services, needed, drives, config.cluster.mesh_nodes)


def gpus_needed(meshes: dict[str, MeshPlan]) -> int:
    """The GPUs this host needs (a mesh on cluster nodes brings its own)."""
    return sum(p.num_gpus for p in meshes.values() if not p.nodes)


def check_gpus(meshes: dict[str, MeshPlan], available: int) -> None:
    need = gpus_needed(meshes)
    if need > available:
        layout = ", ".join(f"{m.name}={m.num_gpus}" for m in meshes.values() if m.num_gpus and not m.nodes)
        raise ValueError(
            f"services needs {need} GPUs ({layout}) but {available} are visible: "
            f"choose a smaller services= layout or run on a machine with more GPUs"
        )


def device_of(meshes: dict[str, MeshPlan], service: str) -> list[list[str]]:
    for plan in meshes.values():
        if service in plan.services:
            return plan.devices
    raise KeyError(service)
