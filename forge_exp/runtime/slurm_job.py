"""monarch.job.SlurmJob, as runtime/hosts.py uses it for cluster=slurm: one job for the run, a HostMesh per mesh.

Where CompatSlurmJob departs from monarch.job.SlurmJob:
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

import ipaddress
import json
import logging
import socket
import subprocess
import time
from typing import Any

from monarch.job import SlurmJob

log = logging.getLogger(__name__)

KILL_WAIT_S = 90.0  # after scancel, until the job has left the queue (SLURM's KillWait is 30 s by default)
# states of a job that still holds its nodes (squeue prints them; everything else is over)
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING",
               "STAGE_OUT", "STOPPED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"}


class CompatSlurmJob(SlurmJob):
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
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except socket.gaierror:
        return False  # not resolvable here: not this machine's loopback either
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
