"""A Hydra multirun as one MLflow parent run with one child run per job, and the table that compares them.

    on_multirun_start  (launching process)  create/migrate the store, create the parent run, write
                                            `<sweep dir>/forge_sweep.json`, export FORGE_EXP_PARENT_RUN_ID
    on_job_start       (each job's process) read forge_sweep.json, export FORGE_EXP_PARENT_RUN_ID and
                                            MLFLOW_TRACKING_URI: cli.py makes the job's run a child of the parent
    on_multirun_end    (launching process)  collect the children, print the table, log it to the parent
    (at exit, if the sweep stopped early: the same, and the parent is marked FAILED)

The callback is configured in conf/config.yaml (hydra.callbacks); mlflow is only imported when a sweep starts.
The resolvers that size a job for the launchers are in launch/resources.py. docs/sweeps.md is the user's guide.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf


SWEEP_FILE = "forge_sweep.json"  # in the sweep dir: where the jobs find the store and the parent run
PARENT_ENV = "FORGE_EXP_PARENT_RUN_ID"
SWEPT_ENV = "FORGE_EXP_SWEPT"  # the swept keys, comma-separated: a child run is named by their values
# the columns of the summary table, after the swept keys: (header, metric key in the child run)
METRICS = (("accuracy_end", "summary/eval/accuracy_end"), ("reward", "reward/mean"), ("kl", "loss/kl"))


# --- the callback ----------------------------------------------------------------------------------------------
class SweepTracker(Callback):
    """Configured in conf/config.yaml under hydra.callbacks; does nothing for single runs."""

    def __init__(self) -> None:
        self.state: dict[str, str] | None = None  # uri, experiment, parent_run_id, sweep_dir (plain: pickled)
        self._env_before: dict[str, str | None] = {}
        self._finished = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from forge_exp.tracking.mlflow import Tracker, default_tracking_uri, ensure_store

        if launcher_problem(config):  # the launcher raises it, one line; no store or parent run for a sweep that
            return                    # cannot start (Hydra only warns about a callback's exception)
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
        self.finish("FINISHED", jobs_ended=True)

    def _finish_at_exit(self) -> None:
        if not self._finished:  # a job failed or the sweep was interrupted: on_multirun_end never ran
            self.finish("FAILED")

    def finish(self, status: str, jobs_ended: bool = False) -> list[dict[str, Any]]:
        """Print the table, log it to the parent run, close the parent. Idempotent. `jobs_ended`: every job has
        returned, so a child still RUNNING lost its controller (reconcile_children)."""
        if self._finished or self.state is None:
            return []
        self._finished = True
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.state["uri"])
        if jobs_ended:
            reconcile_children(client, self.state)
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
              f"  parent MLflow run {parent} in {self.state['uri']} (table: artifact sweep/summary.json)\n"
              f"  compare the runs: {compare_url(self.state, [r['run_id'] for r in rows])}", flush=True)
        return rows

    def _export(self, state: dict[str, str], set_uri: bool) -> None:
        wanted = {PARENT_ENV: state["parent_run_id"], SWEPT_ENV: ",".join(state.get("swept", [])),
                  **({"MLFLOW_TRACKING_URI": state["uri"]} if set_uri else {})}
        for key, value in wanted.items():
            self._env_before.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def __getstate__(self) -> dict[str, Any]:  # pickled into submitit jobs: the job must not finish the sweep
        return {**self.__dict__, "_finished": True, "_env_before": {}}


def launcher_problem(config: DictConfig) -> str | None:
    """Why the sweep's launcher cannot submit, in one line, or None. The SLURM launcher needs sbatch on PATH, a
    controller that answers (asked once per process: the callback and the launcher both ask), and a partition with
    a node that can hold one job's request (launch/slurm_fit.py)."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    if not target.endswith("SlurmLauncher"):
        return None
    if problem := slurm_problem("hydra/launcher=submitit_slurm", "hydra/launcher=submitit_local"):
        return problem
    from forge_exp.launch.slurm_fit import request_problem

    try:
        return request_problem(OmegaConf.to_container(config.hydra.launcher, resolve=True))
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):  # SLURM said nothing we can read: it
        return None  # decides, and the launcher watches the jobs' pending reasons


_PROBED: dict[str, str | None] = {}


def slurm_problem(needed_by: str, instead: str) -> str | None:
    """Why SLURM cannot take a job from this machine, in one line that names what needs it (`needed_by`) and what
    to use `instead`, or None. The SLURM clients are asked once per process."""
    if needed_by not in _PROBED:
        _PROBED[needed_by] = _probe_slurm(needed_by, instead)
    return _PROBED[needed_by]


def _probe_slurm(needed_by: str, instead: str) -> str | None:
    fix = f'on this machine start the development SLURM with eval "$(bash launchers/slurm/start.sh)", or use {instead}'
    if shutil.which("sbatch") is None:
        return f"{needed_by} needs SLURM's sbatch on PATH and there is none here; {fix}"
    try:
        probe = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=15)
        answered, why = probe.returncode == 0, (probe.stderr.strip().splitlines() or ["no output"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        answered, why = False, str(e)
    return None if answered else f"{needed_by}: no SLURM controller answers ({why}); {fix}"


def run_name(overrides: list[str], swept: list[str]) -> str | None:
    """A sweep job's run name from the values of the swept keys it ran with: "beta=0.04,clip_high=0.28"."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.key_or_group in swept:
            values[o.key_or_group] = o.input_line.split("=", 1)[1] if o.input_line else str(o.value())
    leaves = [k.rsplit(".", 1)[-1] for k in values]
    names = {k: (k.rsplit(".", 1)[-1] if leaves.count(k.rsplit(".", 1)[-1]) == 1 else k) for k in values}
    return ",".join(f"{names[k]}={v}" for k, v in values.items()) or None


def compare_url(state: dict[str, Any], run_ids: list[str]) -> str:
    """The MLflow UI's compare view of the sweep's children (for a local store: once `mlflow ui` serves it)."""
    uri = state["uri"]
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    runs = quote(json.dumps(run_ids, separators=(",", ":")))
    experiments = quote(json.dumps([str(state["experiment_id"])]))
    url = f"{base}/#/compare-runs?runs={runs}&experiments={experiments}&workflowType=machine_learning"
    if base == "http://127.0.0.1:5000":
        from forge_exp.tracking.mlflow import ui_command

        return f"{url}  (after: {ui_command(uri)})"
    return url


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


def reconcile_children(client, state: dict[str, Any]) -> list[str]:
    """Children still RUNNING once every job has ended: their controller died without closing them (SIGKILL, a lost
    node, MLflow unreachable at its end). Mark them KILLED, saying why; returns their run ids."""
    stale = client.search_runs(
        [state["experiment_id"]], max_results=10000,
        filter_string=f"tags.mlflow.parentRunId = '{state['parent_run_id']}' and attributes.status = 'RUNNING'",
    )
    for run in stale:
        client.set_tag(run.info.run_id, "forge_exp.end", "its sweep job ended without closing the run; marked by the "
                                                         "sweep's parent")
        client.set_terminated(run.info.run_id, status="KILLED")
    return [run.info.run_id for run in stale]


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
