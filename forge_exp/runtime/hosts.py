"""Hosts for the proc meshes that `cluster=slurm` puts on a SLURM allocation: one Monarch job for the run
(monarch.job.SlurmJob, one HostMesh per mesh name), procs spawned on those hosts instead of on this_host(). The
meshes that `cluster.hosts` does not name stay on this host (Runtime).

    hosts = hosts_for(config, meshes)   # None for cluster=local
    await hosts.start()                 # sbatch; wait until the allocation runs; attach to its Monarch workers
    procs = hosts.procs(plan, command)  # the mesh's procs (plan.per_host on each of its hosts), started by the
                                        # runtime's bootstrap command, seen as {replicas, procs} like a local mesh
    await hosts.stop()                  # its proc meshes, the host meshes, then scancel and wait until it is gone

`start()` also registers an atexit hook that cancels the job, for a controller that exits without `stop()`; one that
is SIGKILLed leaves the job to its time limit (cluster.timeout_min).

Where _SlurmJob departs from monarch.job.SlurmJob:
- SLURM before 23.02 (Debian 12 ships 22.05) answers `squeue --json` in another shape: it ignores `--job` (every
  job is listed), gives `job_state` as a string and the nodes as `job_resources.allocated_nodes[].nodename`, where
  SlurmJob reads the first job and `job_resources.nodes.allocation[].name`. `_get_job_info_json` picks the job by
  id and gives it the shape SlurmJob reads.
- Monarch's TCP transport advertises this host's name and refuses a name that resolves to loopback addresses only
  (a machine whose /etc/hosts maps its name to 127.0.0.1, as the dev SLURM's sandbox does). Then the transport is
  TCP on localhost, which works only when every node of the allocation is this machine: checked, else one error.
- `_kill()` (scancel) waits until the job has left the queue, so no worker outlives the run (bounded: KILL_WAIT_S).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

from monarch.actor import Actor, ProcMesh, endpoint
from monarch.job import JobTrait, SlurmJob

from forge_exp.runtime.layout import MeshPlan

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 120.0  # from "the allocation runs" to "its workers answer"
SHUTDOWN_TIMEOUT_S = 30.0  # per host mesh, at stop
KILL_WAIT_S = 90.0  # after scancel, until the job has left the queue (SLURM's KillWait is 30 s by default)
# states of a job that still holds its nodes (squeue prints them; everything else is over)
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING",
               "STAGE_OUT", "STOPPED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"}


class ClusterHosts:
    """The host meshes of one Monarch job (any JobTrait: SlurmJob here, ProcessJob in the tests), by mesh name."""

    def __init__(self, job: JobTrait, names: list[str], describe: dict[str, Any] | None = None,
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


def hosts_for(config, meshes: dict[str, MeshPlan]) -> ClusterHosts | None:
    """The cluster hosts of a run, or None when every mesh stays on this host (cluster=local)."""
    cluster = config.cluster
    if getattr(cluster, "name", "local") == "local":
        return None
    on_nodes = {name: plan for name, plan in meshes.items() if plan.nodes}
    gpus = cluster.gpus_per_node
    if gpus is None:
        gpus = max(p.procs_per_host * p.gpus for p in on_nodes.values())
    cpus = cluster.cpus_per_node or 1 + max(p.procs_per_host * p.threads for p in on_nodes.values())
    log_dir = cluster.log_dir or os.path.join(config.output_dir or os.getcwd(), "slurm")
    job = _SlurmJob(
        meshes={name: plan.nodes for name, plan in on_nodes.items()},
        python_exe=cluster.python or sys.executable,
        # GPUs as an sbatch option rather than SlurmJob's gpus_per_node: with that, a shared node (exclusive off)
        # and a partition make SlurmJob size the job through the optional `clusterscope` package instead
        slurm_args=[*([f"--gpus-per-node={gpus}"] if gpus else []), *cluster.sbatch_args],
        monarch_port=cluster.port,
        job_name=re.sub(r"[^\w.-]", "_", f"forge-exp-{config.name}"),
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


class _SlurmJob(SlurmJob):
    """monarch.job.SlurmJob, for SLURM 22.05's `squeue --json` and hosts whose name resolves to loopback (see the
    module docstring). `job_id` once submitted."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._loopback = _loopback_only(socket.gethostname())
        if self._loopback:
            from monarch._rust_bindings.monarch_hyperactor.channel import ChannelTransport
            from monarch._rust_bindings.monarch_hyperactor.config import configure

            configure(default_transport=ChannelTransport.TcpWithLocalhost)

    @property
    def job_id(self) -> str | None:
        return self._slurm_job_id

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        try:
            out = subprocess.run(["squeue", "--job", job_id, "--json"], capture_output=True, text=True, check=True)
            return squeue_job(json.loads(out.stdout), job_id)
        except (subprocess.CalledProcessError, json.JSONDecodeError, KeyError, TypeError) as e:
            log.warning("cannot read the state of SLURM job %s from squeue: %s", job_id, e)
            return None

    def _wait_for_job_start(self, job_id: str, expected_nodes: int, timeout: int | None = None) -> list[str]:
        hostnames = super()._wait_for_job_start(job_id, expected_nodes, timeout)
        elsewhere = [h for h in hostnames if not _loopback_only(h)]
        if self._loopback and elsewhere:
            self._kill()
            raise RuntimeError(
                f"this host's name {socket.gethostname()!r} resolves to loopback addresses only, so the workers on "
                f"{', '.join(elsewhere)} could not reach this controller: give this host a name that resolves to "
                f"an address they can reach (DNS or /etc/hosts)")
        return hostnames

    def _kill(self) -> None:
        job_id = self._slurm_job_id
        super()._kill()  # scancel
        if job_id is None:
            return
        deadline = time.monotonic() + KILL_WAIT_S
        while (state := self._queue_state(job_id)) in LIVE_STATES:
            if time.monotonic() > deadline:
                log.warning("SLURM job %s is still %s %.0f s after scancel", job_id, state, KILL_WAIT_S)
                return
            time.sleep(0.5)

    @staticmethod
    def _queue_state(job_id: str) -> str:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""  # squeue fails for a job it no longer knows


def squeue_job(answer: dict[str, Any], job_id: str) -> dict[str, Any] | None:
    """The job `job_id` from `squeue --json`, in the shape monarch's SlurmJob reads (SLURM 23.02+): `job_state` a
    list, `job_resources.nodes.allocation[].name`. SLURM 22.05 lists every job, `job_state` as a string and the
    nodes as `job_resources.allocated_nodes[].nodename`."""
    for job in answer.get("jobs", []):
        if str(job.get("job_id")) != str(job_id):
            continue
        state = job.get("job_state", [])
        resources = job.get("job_resources") or {}
        if not isinstance(resources.get("nodes", {}), dict):  # 22.05: "nodes" is the node list as a string
            resources = {"nodes": {"allocation": [{"name": n["nodename"]}
                                                  for n in resources.get("allocated_nodes", [])]}}
        return {**job, "job_state": [state] if isinstance(state, str) else state, "job_resources": resources}
    return None


def _loopback_only(hostname: str) -> bool:
    import ipaddress

    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except socket.gaierror:
        return False  # not resolvable here: not this machine's loopback either
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
