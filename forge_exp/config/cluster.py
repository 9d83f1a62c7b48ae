"""Schemas of the `cluster` group: where the hosts of the proc meshes come from. Like `services`, it says *where*,
never *what* (STYLE 5).

    cluster=local   every proc mesh on this host (Monarch's this_host()): the default
    cluster=slurm   the meshes named in `hosts` on the nodes of one SLURM allocation for the run, through Monarch's
                    own job API (monarch.job.SlurmJob: one HostMesh per mesh name); the others stay on this host

runtime/hosts.py builds the job; runtime/layout.py checks `hosts` against the run's meshes (docs/multihost.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from forge_exp.checks import FieldError, at_least, not_empty, within


@dataclass
class ClusterBase:
    """What every cluster option answers: its name, and which proc meshes it puts on nodes of an allocation."""

    name: str = "local"

    @property
    def mesh_nodes(self) -> Dict[str, int]:
        """Proc mesh -> nodes of the cluster allocation it spans; {}: every mesh on this host."""
        return {}


@dataclass
class LocalCluster(ClusterBase):
    """conf/cluster/local.yaml: every mesh on this host."""

    name: str = "local"


@dataclass
class SlurmCluster(ClusterBase):
    """conf/cluster/slurm.yaml: the meshes in `hosts` on one SLURM allocation (one sbatch for the run, one Monarch
    worker per node; `srun` starts them, the run's controller attaches to them and ends the job at its end)."""

    name: str = "slurm"
    # proc mesh (services.<service>.mesh, or the service's name) -> nodes of the allocation it spans
    hosts: Dict[str, int] = field(default_factory=lambda: {"trainer": 1})
    partition: Optional[str] = None  # sbatch --partition; null: the cluster's default
    account: Optional[str] = None  # sbatch --account
    qos: Optional[str] = None  # sbatch --qos
    timeout_min: int = 240  # the allocation's time limit (sbatch --time): it also bounds a job whose controller died
    gpus_per_node: Optional[int] = None  # null: what the meshes on SLURM need on one node (their procs × gpus)
    cpus_per_node: Optional[int] = None  # null: their procs × threads on one node, + 1 for the node's worker
    exclusive: bool = False  # sbatch --exclusive: whole nodes
    job_start_timeout_s: int = 600  # how long the allocation may stay pending before the run gives up
    python: Optional[str] = None  # the workers' interpreter on the nodes; null: the one running forge-exp
    port: int = 22222  # each node's Monarch worker listens here (Monarch's default); one run per node and port
    sbatch_args: List[str] = field(default_factory=list)  # any other sbatch options, e.g. ["--mem=64G"]
    log_dir: Optional[str] = None  # the workers' stdout/stderr; null: <run output dir>/slurm

    def __post_init__(self) -> None:
        if not self.hosts:
            raise FieldError("hosts", "must name at least one proc mesh, e.g. {trainer: 1} (or use cluster=local)")
        for mesh, nodes in self.hosts.items():
            not_empty("hosts", mesh, "{trainer: 1}")
            at_least(f"hosts.{mesh}", nodes, 1, "nodes of the allocation")
        at_least("timeout_min", self.timeout_min, 1)
        at_least("job_start_timeout_s", self.job_start_timeout_s, 1)
        within("port", self.port, 1, 65535)
        if self.gpus_per_node is not None:
            at_least("gpus_per_node", self.gpus_per_node, 0)
        if self.cpus_per_node is not None:
            at_least("cpus_per_node", self.cpus_per_node, 1)
        if self.python is not None:
            not_empty("python", self.python, "/opt/venvs/forge/bin/python")
        for arg in self.sbatch_args:
            # Monarch passes on only the arguments that start with '-' (and drops the rest without a word)
            if not re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", arg):
                raise FieldError("sbatch_args", f"must be sbatch options such as --mem=64G, got {arg!r}")

    @property
    def mesh_nodes(self) -> Dict[str, int]:
        return dict(self.hosts)


CLUSTER_SCHEMAS = {"local": LocalCluster, "slurm": SlurmCluster}
