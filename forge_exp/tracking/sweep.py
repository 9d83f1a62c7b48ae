"""A Hydra multirun as one MLflow parent run with one child run per job, and the table that compares them.

    on_multirun_start  (launching process)  create/migrate the store, create the parent run, write
                                            `<sweep dir>/forge_sweep.json`, export FORGE_EXP_PARENT_RUN_ID
    on_job_start       (each job's process) read forge_sweep.json, export FORGE_EXP_PARENT_RUN_ID and
                                            MLFLOW_TRACKING_URI: cli.py makes the job's run a child of the parent
    on_multirun_end    (launching process)  collect the children, print the table, log it to the parent
    (at exit, if the sweep stopped early: the same, and the parent is marked FAILED)

Also here: the OmegaConf resolvers the submitit launcher configs (conf/hydra/launcher/) use to size a job from the
`services` layout and to read the user's cluster settings, registered with our launchers by register(), which
cli.py calls at import. The callback is configured in conf/config.yaml (hydra.callbacks); mlflow is only imported
when a sweep starts. docs/sweeps.md is the user's guide.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf


SWEEP_FILE = "forge_sweep.json"  # in the sweep dir: where the jobs find the store and the parent run
PARENT_ENV = "FORGE_EXP_PARENT_RUN_ID"
CLUSTER_ENV = "FORGE_EXP_CLUSTER_CONFIG"
CLUSTER_FILE = "~/.config/forge-exp/cluster.yaml"
CLUSTER_KEYS = {  # what a cluster user may set once; anything else in the file is an error
    "partition", "account", "qos", "constraint", "exclude", "timeout_min", "mem_gb_per_proc", "mem_gb_per_gpu",
    "array_parallelism", "max_num_timeout", "setup", "additional_parameters",
}
# the columns of the summary table, after the swept keys: (header, metric key in the child run)
METRICS = (("accuracy_end", "summary/eval/accuracy_end"), ("reward", "reward/mean"), ("kl", "loss/kl"))


# --- resolvers for conf/hydra/launcher/*.yaml ----------------------------------------------------------------
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


def register() -> None:
    """The resolvers, and our submitit launchers (hydra_plugins/forge_exp_launcher): Hydra's plugin scan finds
    those in a regular install but not through an editable install's import hook. Called by cli.py at import."""
    _register_resolvers()
    try:
        from hydra.core.plugins import Plugins
        from hydra_plugins.forge_exp_launcher.launcher import LocalLauncher, SlurmLauncher
    except ImportError:  # the `sweep` extra (hydra-submitit-launcher) is not installed
        return
    plugins = Plugins.instance()
    for cls in (SlurmLauncher, LocalLauncher):
        if f"{cls.__module__}.{cls.__name__}" not in plugins.class_name_to_class:
            plugins.register(cls)


# --- the callback ----------------------------------------------------------------------------------------------
class SweepTracker(Callback):
    """Configured in conf/config.yaml under hydra.callbacks; does nothing for single runs."""

    def __init__(self) -> None:
        self.state: dict[str, str] | None = None  # uri, experiment, parent_run_id, sweep_dir (plain: pickled)
        self._env_before: dict[str, str | None] = {}
        self._finished = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from forge_exp.tracking.mlflow import Tracker, default_tracking_uri, ensure_store

        uri = config.tracking.uri or default_tracking_uri()
        ensure_store(uri)  # before any job opens it: concurrent creation corrupts a sqlite store
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        swept, fixed = sweep_space(config)
        parent = Tracker(
            uri, config.tracking.experiment, run_name=f"sweep-{config.name}-{sweep_dir.name}",
            tags={
                "forge_exp.sweep": "parent", "forge_exp.sweep.dir": str(sweep_dir),
                "forge_exp.sweep.sweeper": _short_target(config.hydra.sweeper),
                "forge_exp.sweep.launcher": _short_target(config.hydra.launcher),
                "forge_exp.overrides": " ".join(config.hydra.overrides.task) or "(defaults)",
                **_git_commit(),
            },
        )
        parent.log_params({**{f"sweep.{k}": v for k, v in swept.items()}, **{f"fixed.{k}": v for k, v in fixed.items()}})
        self.state = {
            "uri": uri, "experiment": config.tracking.experiment, "experiment_id": parent.experiment_id,
            "parent_run_id": parent.run_id, "sweep_dir": str(sweep_dir), "swept": list(swept),
        }
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(self.state, indent=1))
        self._export(self.state, set_uri=config.tracking.uri is None)
        atexit.register(self._finish_at_exit)
        print(f"forge-exp sweep: parent MLflow run {parent.run_id} in {uri}; jobs write to {sweep_dir}", flush=True)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        path = Path(str(config.hydra.sweep.dir)) / SWEEP_FILE
        if path.is_file():  # the launching process's environment may not reach the job (another host, --export)
            self._export(json.loads(path.read_text()), set_uri=config.tracking.uri is None)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.finish("FINISHED")

    def _finish_at_exit(self) -> None:
        if not self._finished:  # a job failed or the sweep was interrupted: on_multirun_end never ran
            self.finish("FAILED")

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Print the table, log it to the parent run, close the parent. Idempotent."""
        if self._finished or self.state is None:
            return []
        self._finished = True
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.state["uri"])
        rows = collect(client, self.state)
        table = format_table(rows, self.state["swept"])
        parent = self.state["parent_run_id"]
        columns = {k: [r.get(k) for r in rows] for k in rows[0]} if rows else {"run_id": []}
        client.log_table(parent, data=columns, artifact_file="sweep/summary.json")
        client.log_text(parent, table + "\n", "sweep/summary.txt")
        finished = [r for r in rows if r["status"] == "FINISHED" and r.get("accuracy_end") is not None]
        metrics = {"sweep/jobs": len(rows), "sweep/jobs_finished": len(finished)}
        if finished:
            best = max(finished, key=lambda r: r["accuracy_end"])
            metrics["sweep/best_accuracy_end"] = best["accuracy_end"]
            client.set_tag(parent, "forge_exp.sweep.best_run_id", best["run_id"])
        for k, v in metrics.items():
            client.log_metric(parent, k, v)
        client.set_terminated(parent, status=status)
        for key, value in self._env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        print(f"\nforge-exp sweep {status.lower()}: {len(finished)} of {len(rows)} jobs finished\n{table}\n"
              f"  parent MLflow run {parent} in {self.state['uri']} (table: artifact sweep/summary.json)", flush=True)
        return rows

    def _export(self, state: dict[str, str], set_uri: bool) -> None:
        wanted = {PARENT_ENV: state["parent_run_id"], **({"MLFLOW_TRACKING_URI": state["uri"]} if set_uri else {})}
        for key, value in wanted.items():
            self._env_before.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def __getstate__(self) -> dict[str, Any]:  # pickled into submitit jobs: the job must not finish the sweep
        return {**self.__dict__, "_finished": True, "_env_before": {}}


# --- the sweep's space and the summary table -------------------------------------------------------------
def sweep_space(config: DictConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(swept key -> its values as written, fixed key -> value) from the command line and hydra.sweeper.params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept: dict[str, str] = {}
    fixed: dict[str, str] = {}
    for o in OverridesParser.create().parse_overrides(list(config.hydra.overrides.task)):
        text = o.input_line.split("=", 1)[1] if o.input_line and "=" in o.input_line else str(o.value())
        (swept if o.is_sweep_override() else fixed)[o.key_or_group] = text
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    for key, spec in params.items():
        swept.setdefault(str(key), str(spec))
    return swept, fixed


def collect(client, state: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per child run of the sweep's parent, ordered by the swept values."""
    runs = client.search_runs(
        [state["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{state['parent_run_id']}'",
        max_results=10000,
    )
    rows = []
    for run in runs:
        params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
        row: dict[str, Any] = {k: params.get(k, _override_value(tags, k)) for k in state["swept"]}
        for name, key in METRICS:
            row[name] = metrics.get(key)
        end = run.info.end_time or int(time.time() * 1000)
        row.update(
            job=tags.get("forge_exp.sweep.job"),
            status=run.info.status,
            wall_s=round((end - run.info.start_time) / 1000, 1),
            slurm_job=_slurm_job(tags),
            run_id=run.info.run_id,
            overrides=tags.get("forge_exp.overrides", ""),
        )
        rows.append(row)
    return sorted(rows, key=lambda r: (_sortable(r["job"]), *(_sortable(r[k]) for k in state["swept"]), r["run_id"]))


def format_table(rows: list[dict[str, Any]], swept: list[str]) -> str:
    if not rows:
        return "  (no child runs)"
    cols = ["job", *swept, *(name for name, _ in METRICS), "wall_s", "status", "slurm_job", "run_id"]
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  " + "  ".join(v.rjust(w) if i < len(cols) - 3 else v.ljust(w)  # noqa: E731
                                         for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, cells)])


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _sortable(v: Any) -> tuple[int, Any]:
    try:
        return (0, float(v))
    except (TypeError, ValueError):
        return (1, str(v))


def _override_value(tags: dict[str, str], key: str) -> str | None:
    for part in tags.get("forge_exp.overrides", "").split():
        if part.lstrip("+~").startswith(key + "="):
            return part.split("=", 1)[1]
    return None


def _slurm_job(tags: dict[str, str]) -> str | None:
    if tags.get("slurm.slurm_array_job_id"):
        return f"{tags['slurm.slurm_array_job_id']}_{tags.get('slurm.slurm_array_task_id', '')}"
    return tags.get("slurm.slurm_job_id")


def _short_target(node: Any) -> str:
    target = str(OmegaConf.select(node, "_target_", default="") or "")
    return target.rsplit(".", 1)[-1] or "?"


def _git_commit() -> dict[str, str]:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"mlflow.source.git.commit": out} if out else {}


def mark_children_stopped(sweep_dir: str | Path, stopped: dict[str, str]) -> None:
    """Children of jobs that SLURM ended (cancelled, preempted, node failure, time limit) are left RUNNING, or
    FAILED by an app that saw its processes die: give them the status SLURM's state means. `stopped` maps a
    job's overrides (as in the forge_exp.overrides tag) to that status. Called by the launcher once all jobs ended."""
    path = Path(sweep_dir) / SWEEP_FILE
    if not path.is_file() or not stopped:
        return
    from mlflow.tracking import MlflowClient

    state = json.loads(path.read_text())
    client = MlflowClient(state["uri"])
    for run in client.search_runs([state["experiment_id"]], f"tags.mlflow.parentRunId = '{state['parent_run_id']}'"):
        status = stopped.get(run.data.tags.get("forge_exp.overrides", ""))
        if status and run.info.status in ("RUNNING", "FAILED"):
            client.set_terminated(run.info.run_id, status=status)
