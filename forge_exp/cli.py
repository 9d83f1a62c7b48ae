"""`forge-exp`: validate the config → build the actor mesh → run the app → close."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from forge_exp.config.store import register
from forge_exp.config.validate import validate
from forge_exp.tracking import sweep

register()
sweep.register()  # resolvers and launchers for conf/hydra/launcher/*.yaml (forge_exp/tracking/sweep.py)
log = logging.getLogger("forge_exp")
# conf/hydra/launcher/submitit_{slurm,local}.yaml extend the submitit plugin's schema of the same name on purpose
# (typed launcher keys, our defaults under the name users know); Hydra 1.3 warns about such name matching.
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema")


@hydra.main(version_base=None, config_path="pkg://forge_exp.conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    t0 = time.time()
    try:
        config = validate(cfg)
    except ValueError as e:  # one clear line, before any process is spawned
        print(f"forge-exp: error: {e}", file=sys.stderr)
        sys.exit(2)

    from forge_exp.apps import run_app  # imports monarch: only after the config is known to be good
    from forge_exp.apps.checkpoint import latest
    from forge_exp.runtime.layout import needed_services, plan_meshes
    from forge_exp.runtime.services import Runtime
    from forge_exp.tracking.mlflow import Tracker, default_tracking_uri

    config.output_dir = config.output_dir or HydraConfig.get().runtime.output_dir
    config.checkpoint.dir = config.checkpoint.dir or os.path.join(config.output_dir, "checkpoints")
    resume = latest(config.checkpoint.dir) if config.resume else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    tracker = Tracker(
        config.tracking.uri or default_tracking_uri(),
        config.tracking.experiment,
        run_name=config.tracking.run_name or _default_run_name(config.name),
        tags=_run_tags(),
        # a sweep job: the sweep's parent run, exported by forge_exp.tracking.sweep.SweepTracker (hydra.callbacks)
        parent_run_id=config.tracking.parent_run_id or os.environ.get("FORGE_EXP_PARENT_RUN_ID"),
        run_id=resume.run_id if resume else None,
        hold=config.checkpoint.every > 0,
    )
    if resume and not resume.flushed:  # the run died between writing the checkpoint and logging its metrics
        tracker.send(resume.pending_metrics)
        resume.mark_flushed()
    with tracker:
        tracker.log_params(resolved)
        tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
        runtime = Runtime(plan_meshes(config.services, needed_services(config.algorithm.beta)))
        summary = asyncio.run(_run(run_app, config, runtime, tracker, resume))
        tracker.log_metrics({f"summary/{k}": v for k, v in summary.items()}, step=config.steps)
    _print_summary(summary, tracker, time.time() - t0)
    return summary.get("eval/accuracy_end")


async def _run(run_app, config, runtime, tracker, resume) -> dict[str, float]:
    async with runtime:  # every proc mesh is stopped on success, error and Ctrl-C
        return await run_app(config, runtime, tracker, resume)


def _default_run_name(name: str) -> str:
    hc = HydraConfig.get()
    return f"{name}-{hc.job.num}" if hc.mode == RunMode.MULTIRUN else name  # sweep jobs: distinct names in the UI


def _run_tags() -> dict[str, str]:
    hc = HydraConfig.get()
    tags = {"forge_exp.overrides": " ".join(hc.overrides.task) or "(defaults)"}
    if hc.mode == RunMode.MULTIRUN:
        tags["forge_exp.sweep.job"] = str(hc.job.num)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip()
        if commit:
            tags["mlflow.source.git.commit"] = commit
    except (OSError, subprocess.SubprocessError):
        pass
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        if os.environ.get(var):
            tags[f"slurm.{var.lower()}"] = os.environ[var]
    return tags


def _print_summary(summary: dict[str, float], tracker, seconds: float) -> None:
    lines = [f"forge-exp: finished in {seconds / 60:.1f} min"]
    if "eval/accuracy_start" in summary:
        start, end = summary["eval/accuracy_start"], summary["eval/accuracy_end"]
        lines.append(f"  held-out accuracy (greedy): {start:.3f} at the start of RL -> {end:.3f} at the end "
                     f"({end - start:+.3f})")
    if "warmstart/accuracy" in summary:
        lines.append(f"  warm start: {summary['warmstart/seconds']:.0f} s")
    lines.append(f"  MLflow run {tracker.run_id} (experiment id {tracker.experiment_id}) in {tracker.uri}")
    lines.append(f"  open the UI: {tracker.ui_command()}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
