"""Proc meshes from the `services` plan, actors spawned onto them, and replica routing.

One proc mesh per entry of `plan_meshes`, shaped {"replicas": R, "procs": P}. Colocated services spawn onto the
same mesh (so on `services=single_gpu` the trainer, reference model and generator share one process and one GPU).
A mesh on cluster nodes (cluster=slurm) is spawned on its hosts in the run's job instead (runtime/hosts.py).
`route()` reaches one replica (round-robin), `fanout()` all of them. A collective service (a sharded trainer: one
torch.distributed world over its processes, which `spawn_collective` sets up) is called on every process of the
replica at once; `call_one` then returns rank 0's answer. Every `route().<endpoint>.call_one(...)` is a span of the
run's timeline (runtime/timeline.py: where the time goes).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any

from monarch.actor import ProcMesh, this_host, this_proc

from forge_exp.config.services import CONTROLLER
from forge_exp.runtime import zygote
from forge_exp.runtime.bootstrap import bootstrap_command
from forge_exp.runtime.layout import MeshPlan
from forge_exp.runtime.supervision import Supervisor, configure_monarch
from forge_exp.runtime.timeline import Timeline

if TYPE_CHECKING:
    from forge_exp.runtime.hosts import ClusterHosts

log = logging.getLogger(__name__)


class Service:
    """Handle to one service's actors: `route()` → one replica, `fanout()` → every replica."""

    def __init__(self, name: str, actors: Any, replicas: int, collective: bool = False, local: bool = False,
                 timeline: Timeline | None = None):
        self.name = name
        self.timeline = timeline  # records the calls made through route()
        self.actors = actors
        self.replicas = replicas
        self.collective = collective
        self.local = local  # one actor in the controller's process (mesh: controller): nothing to slice
        self._next = itertools.cycle(range(replicas))

    def route(self) -> Any:
        if self.local:
            target = self.actors
        elif self.collective:
            target = _EveryProcess(self.actors.slice(replicas=next(self._next)))
        else:
            target = self.actors.slice(replicas=next(self._next), procs=0)
        return target if self.timeline is None else _Timed(target, self.name, self.timeline)

    def replica(self, i: int) -> Any:
        return self.actors if self.local else self.actors.slice(replicas=i, procs=0)

    def fanout(self) -> Any:
        return self.actors


class Runtime:
    """Owns every proc mesh of a run; `stop()` (also via `async with`) ends all of them. Inside `async with`, a
    service that dies or fails to start ends `supervise(work)` with one ServiceFailed (runtime/supervision.py)."""

    def __init__(self, meshes: dict[str, MeshPlan], hosts: "ClusterHosts | None" = None):
        configure_monarch()
        self.plans = meshes
        self.hosts = hosts  # cluster=slurm: the hosts of the meshes on cluster nodes (they own those meshes)
        self.procs: dict[str, ProcMesh] = {}
        self.worlds: dict[str, Any] = {}  # torch.distributed worlds over a mesh (spawn_collective)
        self.supervisor = Supervisor()
        self.timeline = Timeline()  # every service call the app makes through route()
        if not any(zygote.forks(p) for p in meshes.values()):
            zygote.stop()  # no proc of this run can be forked (GPU or cluster meshes only): free its memory now

    def _mesh_for(self, service: str) -> tuple[MeshPlan, ProcMesh]:
        for plan in self.plans.values():
            if service in plan.services:
                if plan.nodes:  # cluster=slurm: on the mesh's hosts in the run's job, with the same bootstrap
                    return plan, self.hosts.procs(plan, bootstrap_command())
                if plan.name not in self.procs:
                    self.procs[plan.name] = this_host().spawn_procs(
                        per_host={"replicas": plan.replicas, "procs": plan.spawn_procs}, name=plan.name,
                        bootstrap_command=zygote.bootstrap_command(plan),  # forked from the pre-imported server
                    )
                    self.supervisor.local[plan.name] = plan.replicas * plan.spawn_procs
                return plan, self.procs[plan.name]
        raise KeyError(f"service '{service}' is not in the services layout")

    def spawn(self, service: str, actor_cls: type, *args: Any, **kwargs: Any) -> Service:
        """Spawn `actor_cls` on the service's mesh. The actor receives `devices` ([replica][proc] → device string)
        and `threads` as keyword arguments so it can place itself."""
        if self._in_controller(service):
            plan = next(p for p in self.plans.values() if service in p.services)
            actors = this_proc().spawn(service, actor_cls, *args, devices=plan.devices, threads=plan.threads,
                                       **kwargs)
            return Service(service, actors, 1, local=True, timeline=self.timeline)
        plan, procs = self._mesh_for(service)
        actors = procs.spawn(service, actor_cls, *args, devices=plan.devices, threads=plan.threads, **kwargs)
        self.supervisor.meshes[service] = plan.name
        return Service(service, actors, plan.replicas, timeline=self.timeline)

    async def spawn_collective(self, service: str, actor_cls: type, *args: Any, backend: str, **kwargs: Any) -> Service:
        """Make the service's processes one torch.distributed world (runtime/torch_world.py: Monarch hands out the
        rendezvous), then spawn `actor_cls` on every one of them; its endpoints are then called on all at once."""
        from forge_exp.runtime.torch_world import init_torch_world

        plan, procs = self._mesh_for(service)
        if plan.replicas != 1:
            raise ValueError(f"services.{service}.replicas must be 1 for a sharded {service}")
        devices = [d for replica in plan.devices for d in replica]
        self.worlds[plan.name] = await init_torch_world(procs, backend, devices if plan.gpus else None,
                                                        local_world_size=plan.procs_per_host)
        actors = procs.spawn(service, actor_cls, *args, devices=plan.devices, threads=plan.threads, **kwargs)
        self.supervisor.meshes[service] = plan.name
        return Service(service, actors, plan.replicas, collective=True, timeline=self.timeline)

    def _in_controller(self, service: str) -> bool:
        """services.<service>.mesh=controller: the actor lives in this process (stopped when it exits)."""
        return CONTROLLER in self.plans and service in self.plans[CONTROLLER].services

    async def stop(self) -> None:
        """Close the torch.distributed worlds, then stop every mesh at once: each stop waits ~0.5 s for its
        processes to exit, so one after the other made shutdown grow with the number of meshes (benchmarks/lean.md)."""
        errors = []
        for name, world in list(self.worlds.items()):
            try:
                from forge_exp.runtime.torch_world import close_torch_world

                await close_torch_world(world)
            except Exception as e:  # keep stopping the rest
                errors.append(f"{name} torch world: {e}")
            self.worlds.pop(name, None)
        procs, self.procs = dict(self.procs), {}
        # together: each waits ~0.5 s for its processes to exit, and a failed run should end promptly
        results = await asyncio.gather(*(p.stop() for p in procs.values()), return_exceptions=True)
        for r in results:  # Ctrl-C or cancellation while stopping: after every mesh was asked to stop
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r
        errors += [f"{name}: {r}" for name, r in zip(procs, results) if isinstance(r, Exception)]
        if errors:
            log.warning("errors while stopping proc meshes: %s", "; ".join(errors))
        # -- then the cluster (cluster=slurm): its proc meshes, its host meshes, then the job itself ---------------
        if self.hosts is not None:
            await self.hosts.stop()

    async def supervise(self, work):
        """Await the app; a service failure cancels it and is raised instead (ServiceFailed)."""
        return await self.supervisor.run(work)

    async def __aenter__(self) -> "Runtime":
        if self.hosts is not None:
            await self.hosts.start()  # ends the job itself if it fails: __aexit__ does not run then
        self.supervisor.install()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.supervisor.closing = True  # the meshes are stopped on purpose now
        try:
            await self.stop()
        finally:
            self.supervisor.uninstall()


class _EveryProcess:
    """A replica's endpoints, each called on all of its processes (a collective): `call_one` returns rank 0's."""

    def __init__(self, actors: Any):
        self._actors = actors

    def __getattr__(self, endpoint: str) -> "_Collective":
        return _Collective(getattr(self._actors, endpoint))


class _Collective:
    def __init__(self, endpoint: Any):
        self._endpoint = endpoint

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        answers = await self._endpoint.call(*args, **kwargs)
        for point, value in answers.items():
            if point.rank == 0:
                return value
        raise RuntimeError("a collective call returned no answer from rank 0")


class _Timed:
    """A replica's endpoints, each `call_one` recorded as a span of the run's timeline."""

    def __init__(self, target: Any, service: str, timeline: Timeline):
        self._target, self._service, self._timeline = target, service, timeline

    def __getattr__(self, endpoint: str) -> "_TimedEndpoint":
        if endpoint.startswith("_"):
            raise AttributeError(endpoint)
        return _TimedEndpoint(getattr(self._target, endpoint), self._service, endpoint, self._timeline)

    def __reduce__(self):
        # Handed to another actor (an env's generator route), a replica travels as itself: spans are the driver's.
        return _untimed, (self._target,)


def _untimed(target: Any) -> Any:
    return target


class _TimedEndpoint:
    def __init__(self, endpoint: Any, service: str, name: str, timeline: Timeline):
        self._endpoint, self._service, self._name, self._timeline = endpoint, service, name, timeline

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timeline.timed(self._service, self._name, self._endpoint.call_one(*args, **kwargs))
