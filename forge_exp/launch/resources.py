"""Sizing a sweep job from the run's `services` layout, and the user's cluster settings: the OmegaConf resolvers
that conf/hydra/launcher/*.yaml use (`${forge_exp.gpus:${services}}`, `${forge_exp.cluster:partition}`).
Registered when this module is imported, which the launchers and cli.py do before Hydra composes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

CLUSTER_ENV = "FORGE_EXP_CLUSTER_CONFIG"
CLUSTER_FILE = "~/.config/forge-exp/cluster.yaml"
CLUSTER_KEYS = {  # what a cluster user may set once; anything else in the file is an error
    "partition", "account", "qos", "constraint", "exclude", "timeout_min", "mem_gb_per_proc", "mem_gb_per_gpu",
    "array_parallelism", "max_num_timeout", "setup", "additional_parameters",
}


def _meshes(services: Any):
    from forge_exp.config.services import ServicesConfig
    from forge_exp.runtime.layout import plan_meshes

    spec = services if isinstance(services, ServicesConfig) else OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(ServicesConfig), services)
    )
    # every service, the reference model included: one array job serves all the sweep's jobs, and some may
    # have beta > 0 even when the base config does not
    return plan_meshes(spec).values()


def job_gpus(services: Any) -> int | None:
    """GPUs one job needs on its node: the sum over the layout's proc meshes (None when it needs none)."""
    return sum(m.num_gpus for m in _meshes(services)) or None


def job_cpus(services: Any) -> int:
    """CPUs one job needs: the torch threads of every process of the layout, plus one for the controller."""
    return 1 + sum(m.replicas * m.procs * m.threads for m in _meshes(services))


def job_mem_gb(services: Any, per_proc: float, per_gpu: float) -> int:
    """Host memory for one job: per_proc for every process (the controller included), per_gpu for every GPU."""
    meshes = list(_meshes(services))
    procs = 1 + sum(m.replicas * m.procs for m in meshes)
    return int(round(procs * per_proc + sum(m.num_gpus for m in meshes) * per_gpu))


def cluster_setting(key: str, default: Any = None) -> Any:
    """A value from the user's cluster file ($FORGE_EXP_CLUSTER_CONFIG, else ~/.config/forge-exp/cluster.yaml)."""
    return load_cluster_settings().get(key, default)


def load_cluster_settings() -> dict[str, Any]:
    path = Path(os.environ.get(CLUSTER_ENV) or CLUSTER_FILE).expanduser()
    if not path.is_file():
        if os.environ.get(CLUSTER_ENV):
            raise ValueError(f"{CLUSTER_ENV}={path}: no such file")
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or set(data) - CLUSTER_KEYS:
        bad = sorted(set(data) - CLUSTER_KEYS) if isinstance(data, dict) else data
        raise ValueError(f"{path}: unknown cluster settings {bad}; allowed: {', '.join(sorted(CLUSTER_KEYS))}")
    return data


def _register_resolvers() -> None:
    for name, fn in {
        "forge_exp.gpus": job_gpus, "forge_exp.cpus": job_cpus, "forge_exp.mem_gb": job_mem_gb,
        "forge_exp.cluster": cluster_setting,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


_register_resolvers()  # Hydra needs them before it composes conf/hydra/launcher/*.yaml (in every job too)
