"""Hosts for the proc meshes that `cluster=slurm` puts on a SLURM allocation: one Monarch job for the run
(monarch.job.SlurmJob, one HostMesh per mesh name), procs spawned on those hosts instead of on this_host(). The
meshes that `cluster.hosts` does not name stay on this host (Runtime).

    hosts = hosts_for(cluster, meshes, name, output_dir)   # None for cluster=local
    await hosts.start()                 # sbatch; wait until the allocation runs; attach to its Monarch workers
    procs = hosts.procs(plan, command)  # the mesh's procs (plan.per_host on each of its hosts), started by the
                                        # runtime's bootstrap command, seen as {replicas, procs} like a local mesh
    await hosts.stop()                  # its proc meshes, the host meshes, then scancel and wait until it is gone

`start()` also registers an atexit hook that cancels the job, for a controller that exits without `stop()`; one that
is SIGKILLed leaves the job to its time limit (cluster.timeout_min). The SLURM job itself is runtime/slurm_job.py,
imported only for cluster=slurm (monarch.job costs a default run ~0.3 s of start-up).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, Any

from monarch.actor import Actor, ProcMesh, endpoint

from forge_exp.config.cluster import ClusterBase, SlurmCluster
from forge_exp.runtime.layout import MeshPlan

if TYPE_CHECKING:
    from monarch.job import JobTrait

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 120.0  # from "the allocation runs" to "its workers answer"
SHUTDOWN_TIMEOUT_S = 30.0  # per host mesh, at stop


class ClusterHosts:
    """The host meshes of one Monarch job (any JobTrait: SlurmJob here, ProcessJob in the tests), by mesh name."""

    def __init__(self, job: "JobTrait", names: list[str], describe: dict[str, Any] | None = None,
                 python: str | None = None):
        self.job = job
        self.names = names
        self.describe = describe or {}  # what the run logs about the job (scheduler, job id)
        self.python = python  # the procs' interpreter on the hosts (cluster.python); None: the bootstrap command's
        self.host_meshes: dict[str, Any] = {}
        self.spawned: dict[str, ProcMesh] = {}
        self._ended = False

    async def start(self) -> None:
        """Submit the job, wait for it and attach to its workers; on any failure (Ctrl-C too) end it again."""
        atexit.register(self._end_job)
        try:
            self.job.apply()
            if getattr(self.job, "job_id", None) is not None:
                self.describe["job_id"] = self.job.job_id
            state = self.job.state(cached_path=None)  # SlurmJob: polls squeue until the allocation runs
            for name in self.names:
                self.host_meshes[name] = getattr(state, name)
            for name, hosts in self.host_meshes.items():
                try:
                    await asyncio.wait_for(hosts.initialized, ATTACH_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise RuntimeError(f"the workers of mesh '{name}' did not answer within {ATTACH_TIMEOUT_S:.0f} s "
                                       f"of the allocation starting ({self._where_logs()})") from None
        except BaseException:
            await self.stop()
            raise

    def procs(self, plan: MeshPlan, command: Any) -> ProcMesh:
        """The mesh's procs on its hosts, spawned once with the bootstrap command `command` (the one the Runtime
        starts its local procs with; its interpreter replaced by `python`), seen through `local_shape`. They are
        owned here: `stop()` ends them."""
        if plan.name not in self.host_meshes:
            raise RuntimeError(f"mesh '{plan.name}' has no hosts: start() the cluster hosts first (async with Runtime)")
        if plan.name not in self.spawned:
            if self.python:
                command.program = self.python
            self.spawned[plan.name] = self.host_meshes[plan.name].spawn_procs(
                per_host=plan.per_host, name=plan.name, bootstrap_command=command)
        return local_shape(self.spawned[plan.name], plan)

    async def placement(self) -> dict[str, Any]:
        """Where each process of the meshes on the cluster runs, asked of the processes themselves: {job: ...,
        meshes: {name: [{rank, host, pid, slurm_job_id, command}, ...]}}."""
        meshes = {}
        for name, procs in self.spawned.items():
            probe = procs.spawn("whereabouts", Whereabouts)
            answers = await probe.where.call()
            meshes[name] = sorted((value for _, value in answers.items()), key=lambda w: w["rank"])
        return {"job": self.describe, "meshes": meshes}

    async def stop(self) -> None:
        """Stop the proc meshes, shut the host meshes down, then end the job. Idempotent."""
        spawned, self.spawned = dict(self.spawned), {}
        results = await asyncio.gather(*(asyncio.wait_for(p.stop(), SHUTDOWN_TIMEOUT_S) for p in spawned.values()),
                                       return_exceptions=True)
        for name, r in zip(spawned, results):
            if isinstance(r, BaseException):  # the host mesh's shutdown and scancel below end its procs anyway
                log.warning("proc mesh %s on the cluster did not stop (%r): shutting its hosts down", name, r)
        for name, hosts in list(self.host_meshes.items()):
            try:
                await asyncio.wait_for(hosts.shutdown(), SHUTDOWN_TIMEOUT_S)
            except BaseException as e:  # noqa: BLE001 — keep going: the job must end whatever happened here
                log.warning("host mesh %s did not shut down (%s): cancelling its job anyway", name, e)
            self.host_meshes.pop(name, None)
        self._end_job()

    def _end_job(self) -> None:
        if self._ended:
            return
        self._ended = True
        atexit.unregister(self._end_job)
        try:
            self.job.kill()
        except Exception as e:  # noqa: BLE001
            log.warning("could not end the job %s: %s", self.describe, e)

    def _where_logs(self) -> str:
        return f"worker logs: {self.describe['logs']}" if "logs" in self.describe else "see the job's logs"


def local_shape(procs: ProcMesh, plan: MeshPlan) -> ProcMesh:
    """A mesh spawned over hosts — {hosts, replicas, procs} — seen as {replicas, procs}, hosts-major: the shape a
    mesh on this host has, so routing (Service), placement (actors/placement.py) and torch.distributed ranks
    (torch_world.py) read it the same way. Only the owned mesh can be stopped."""
    return procs.flatten("ranks").split(ranks=("replicas", "procs"), procs=plan.spawn_procs)


class Whereabouts(Actor):
    """One per process: where it runs."""

    @endpoint
    async def where(self) -> dict[str, Any]:
        from monarch.actor import current_rank

        return {"rank": current_rank().rank, "host": socket.gethostname(), "pid": os.getpid(),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "command": sys.orig_argv}


# ---- SLURM --------------------------------------------------------------------------------------------------------


def hosts_for(cluster: ClusterBase, meshes: dict[str, MeshPlan], run_name: str,
              output_dir: str | None) -> ClusterHosts | None:
    """The cluster hosts of a run (its `cluster` node, its name and output dir), or None when every mesh stays on
    this host (cluster=local)."""
    if not isinstance(cluster, SlurmCluster):
        return None
    from forge_exp.runtime.slurm_job import CompatSlurmJob

    on_nodes = {name: plan for name, plan in meshes.items() if plan.nodes}
    gpus = cluster.gpus_per_node
    if gpus is None:
        gpus = max(p.procs_per_host * p.gpus for p in on_nodes.values())
    cpus = cluster.cpus_per_node or 1 + max(p.procs_per_host * p.threads for p in on_nodes.values())
    log_dir = cluster.log_dir or os.path.join(output_dir or os.getcwd(), "slurm")
    job = CompatSlurmJob(
        meshes={name: plan.nodes for name, plan in on_nodes.items()},
        python_exe=cluster.python or sys.executable,
        # GPUs as an sbatch option rather than SlurmJob's gpus_per_node: with that, a shared node (exclusive off)
        # and a partition make SlurmJob size the job through the optional `clusterscope` package instead
        slurm_args=[*([f"--gpus-per-node={gpus}"] if gpus else []), *cluster.sbatch_args],
        monarch_port=cluster.port,
        job_name=re.sub(r"[^\w.-]", "_", f"forge-exp-{run_name}"),
        time_limit=str(cluster.timeout_min),  # sbatch --time=<minutes>
        partition=cluster.partition,
        account=cluster.account,
        qos=cluster.qos,
        log_dir=log_dir,
        exclusive=cluster.exclusive,
        cpus_per_task=cpus,  # one task (the node's Monarch worker) per node
        job_start_timeout=cluster.job_start_timeout_s,
    )
    return ClusterHosts(job, list(on_nodes), describe={"scheduler": "slurm", "logs": log_dir}, python=cluster.python)
