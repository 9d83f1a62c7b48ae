"""Proc meshes from the `services` plan, actors spawned onto them, and replica routing.

One proc mesh per entry of `plan_meshes`, shaped {"replicas": R, "procs": P}. Colocated services spawn onto the
same mesh (so on `services=single_gpu` the trainer, reference model and generator share one process and one GPU).
`route()` reaches one replica (round-robin), `fanout()` all of them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from monarch.actor import ProcMesh, this_host, this_proc

from forge_exp.config.services import CONTROLLER
from forge_exp.runtime.bootstrap import bootstrap_command
from forge_exp.runtime.layout import MeshPlan

log = logging.getLogger(__name__)


class Service:
    """Handle to one service's actors: `route()` → one replica, `fanout()` → every replica."""

    def __init__(self, name: str, actors: Any, replicas: int, local: bool = False):
        self.name = name
        self.actors = actors
        self.replicas = replicas
        self.local = local  # one actor in the controller's process (mesh: controller): nothing to slice
        self._next = itertools.cycle(range(replicas))

    def route(self) -> Any:
        return self.actors if self.local else self.actors.slice(replicas=next(self._next), procs=0)

    def replica(self, i: int) -> Any:
        return self.actors if self.local else self.actors.slice(replicas=i, procs=0)

    def fanout(self) -> Any:
        return self.actors


class Runtime:
    """Owns every proc mesh of a run; `stop()` (also via `async with`) ends all of them."""

    def __init__(self, meshes: dict[str, MeshPlan]):
        self.plans = meshes
        self.procs: dict[str, ProcMesh] = {}

    def _mesh_for(self, service: str) -> tuple[MeshPlan, ProcMesh]:
        for plan in self.plans.values():
            if service in plan.services:
                if plan.name not in self.procs:
                    self.procs[plan.name] = this_host().spawn_procs(
                        per_host={"replicas": plan.replicas, "procs": plan.procs}, name=plan.name,
                        bootstrap_command=bootstrap_command(),  # exits fast once stopped (runtime/bootstrap.py)
                    )
                return plan, self.procs[plan.name]
        raise KeyError(f"service '{service}' is not in the services layout")

    def spawn(self, service: str, actor_cls: type, *args: Any, **kwargs: Any) -> Service:
        """Spawn `actor_cls` on the service's mesh. The actor receives `devices` ([replica][proc] → device string)
        and `threads` as keyword arguments so it can place itself."""
        if self._in_controller(service):
            plan = next(p for p in self.plans.values() if service in p.services)
            actors = this_proc().spawn(service, actor_cls, *args, devices=plan.devices, threads=plan.threads,
                                       **kwargs)
            return Service(service, actors, 1, local=True)
        plan, procs = self._mesh_for(service)
        actors = procs.spawn(service, actor_cls, *args, devices=plan.devices, threads=plan.threads, **kwargs)
        return Service(service, actors, plan.replicas)

    def _in_controller(self, service: str) -> bool:
        """services.<service>.mesh=controller: the actor lives in this process (stopped when it exits)."""
        return CONTROLLER in self.plans and service in self.plans[CONTROLLER].services

    async def stop(self) -> None:
        """Stop every mesh at once: each stop waits ~0.5 s for its processes to exit, so one after the other made
        shutdown grow with the number of meshes (benchmarks/lean.md)."""
        procs, self.procs = dict(self.procs), {}
        results = await asyncio.gather(*(p.stop() for p in procs.values()), return_exceptions=True)
        for r in results:  # Ctrl-C or cancellation while stopping: after every mesh was asked to stop
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r
        errors = [f"{name}: {r}" for name, r in zip(procs, results) if isinstance(r, Exception)]
        if errors:
            log.warning("errors while stopping proc meshes: %s", "; ".join(errors))

    async def __aenter__(self) -> "Runtime":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
