"""Whether a sweep's SLURM jobs can ever start: asked of the partition before they are submitted, and of their
pending reasons while the launcher waits for them (SLURM keeps a job that cannot fit PENDING for good, and a
sweep that waits on it waits forever).

    request_problem(launcher)    a job's request (CPUs, memory, GPUs, time limit) against the partition's nodes and
                                 limits (sinfo, scontrol): one line naming what does not fit and the key to change
    PendingWatch(array_ids)      .poll(): the jobs' pending reasons (squeue); one line once a reason that never clears
                                 (PartitionConfig, DependencyNeverSatisfied, ...) is seen twice in a row, else None

`hydra.launcher.cpus_per_task`, `mem_gb` and `gpus_per_node` are sized from `services` (launch/resources.py); the
development SLURM advertises what the machine has (launchers/slurm/start.sh), so on a 2-core machine a sweep of the
default layout (4 CPUs a job) is refused here, naming the key.
"""

from __future__ import annotations

import re
import subprocess

# Pending reasons that no waiting clears: the request exceeds a partition or association limit, the job's
# dependency failed, its account or QOS does not exist. (Resources, Priority, ...: the job waits its turn.)
NEVER_CLEARS = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "ReqNodeNotAvail", "BadConstraints",
                "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied")
PER_JOB_LIMIT = re.compile(r"^(Assoc|QOS)\w*PerJob\w*$")  # e.g. QOSMaxCpuPerJobLimit: this job, never
HINTS = {
    "PartitionConfig": "its request exceeds a limit of the partition (scontrol show partition)",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "hydra.launcher.timeout_min exceeds the partition's MaxTime",
    "ReqNodeNotAvail": "the nodes it needs are not available",
    "DependencyNeverSatisfied": "a job it depends on (hydra.launcher.additional_parameters) failed",
    "InvalidAccount": "hydra.launcher.account is not an account of this cluster",
    "InvalidQOS": "hydra.launcher.qos is not a QOS of this cluster",
}
UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "")


def _ask(*args: str) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=15)
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)}: {(out.stderr.strip().splitlines() or ['failed'])[-1]}")
    return out.stdout


def request_problem(launcher: dict) -> str | None:
    """What in a job's request (hydra.launcher's resolved keys) no node of its partition can give, or None."""
    partition = launcher.get("partition")
    listed = [line.split("|") for line in _ask("sinfo", "-h", "-o", "%P|%l").splitlines() if line.strip()]
    partitions = {name.rstrip("*"): limit for name, limit in listed}
    if not partition:
        partition = next((name.rstrip("*") for name, _ in listed if name.endswith("*")), None)
        if partition is None:
            return "hydra.launcher.partition is not set and SLURM has no default partition; set it"
    if partition not in partitions:
        return (f"hydra.launcher.partition={partition}: SLURM has no such partition (it has: "
                f"{', '.join(sorted(partitions)) or 'none'})")
    nodes = [line.split("|") for line in _ask("sinfo", "-h", "-N", "-p", partition, "-o", "%c|%m|%G").splitlines()]
    limits = dict(re.findall(r"(\w+)=(\S*)", _ask("scontrol", "show", "partition", partition, "-o")))
    most = {"cpus": max(int(c) for c, _, _ in nodes), "mem_mb": max(int(m) for _, m, _ in nodes),
            "gpus": max(_gpus(g) for _, _, g in nodes)}
    if limits.get("MaxCPUsPerNode", "UNLIMITED") not in UNLIMITED:
        most["cpus"] = min(most["cpus"], int(limits["MaxCPUsPerNode"]))
    if limits.get("MaxMemPerNode", "UNLIMITED") not in UNLIMITED:
        most["mem_mb"] = min(most["mem_mb"], int(limits["MaxMemPerNode"]))
    where = f"partition {partition}"
    cpus = int(launcher.get("cpus_per_task") or 1) * int(launcher.get("tasks_per_node") or 1)
    if cpus > most["cpus"]:
        return (f"hydra.launcher.cpus_per_task={cpus} (sized from services: 1 for the controller and 1 for each torch "
                f"thread of its processes) is more than any node of {where} has ({most['cpus']} CPUs); lower "
                f"services.<name>.threads, or set hydra.launcher.cpus_per_task={most['cpus']} (the processes then "
                f"share CPUs)")
    mem_gb = launcher.get("mem_gb")
    if mem_gb and int(mem_gb) * 1024 > most["mem_mb"]:
        return (f"hydra.launcher.mem_gb={mem_gb} (mem_gb_per_proc for each process of services) is more than any "
                f"node of {where} has ({most['mem_mb'] / 1024:.1f} GB); set hydra.launcher.mem_gb="
                f"{most['mem_mb'] // 1024} or lower mem_gb_per_proc in the cluster file")
    gpus = int(launcher.get("gpus_per_node") or 0)
    if gpus > most["gpus"]:
        return (f"hydra.launcher.gpus_per_node={gpus} (the GPUs of services) is more than any node of {where} has "
                f"({most['gpus']} GPUs); use a GPU partition (hydra.launcher.partition) or a layout with fewer GPUs")
    limit, timeout = _minutes(partitions[partition]), launcher.get("timeout_min")
    if limit is not None and timeout and int(timeout) > limit:
        return (f"hydra.launcher.timeout_min={timeout} is more than {where} allows ({limit} minutes); set "
                f"hydra.launcher.timeout_min={limit} (checkpoint.every lets a requeued job resume)")
    return None


def _gpus(gres: str) -> int:
    """GPUs in a node's GRES ("gpu:4", "gpu:a100:4(S:0-1)", "(null)")."""
    return sum(int(n) for n in re.findall(r"gpu(?::[^:(,]+)?:(\d+)", gres))


def _minutes(limit: str) -> int | None:
    """A SLURM time limit ("infinite", "60", "1:00:00", "2-00:00:00") in minutes; None when unlimited."""
    if limit.strip().upper() in UNLIMITED:
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        parts = [0, parts[0], 0]  # minutes
    hours, minutes, seconds = ([0] * (3 - len(parts)) + parts)[-3:]
    return int(days or 0) * 1440 + hours * 60 + minutes + (seconds > 0)


def never_clears(reason: str) -> bool:
    code = reason.split(",")[0].strip()
    return code in NEVER_CLEARS or bool(PER_JOB_LIMIT.match(code))


class PendingWatch:
    """The pending reasons of a sweep's array jobs, polled while the launcher waits."""

    def __init__(self, array_ids: list[str]):
        self.array_ids = array_ids
        self.seen: dict[str, str] = {}  # job id -> the reason that never clears, seen at the last poll

    def poll(self) -> str | None:
        """One line when a job has been pending for a reason that never clears at two polls in a row."""
        try:
            out = _ask("squeue", "-h", "-j", ",".join(self.array_ids), "-o", "%i|%T|%r")
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            return None  # the controller did not answer this time: the launcher's own wait goes on
        now = {}
        for line in out.splitlines():
            job, state, reason = (line.split("|", 2) + ["", ""])[:3]
            if state == "PENDING" and never_clears(reason):
                now[job] = reason.split(",")[0].strip()
        stuck = next((job for job, reason in now.items() if self.seen.get(job) == reason), None)
        self.seen = now
        if stuck is None:
            return None
        reason = now[stuck]
        return (f"SLURM job {stuck} can never start: it is PENDING with reason {reason} ("
                f"{HINTS.get(reason, 'a limit this job exceeds')})")
