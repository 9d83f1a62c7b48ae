"""`forge-exp`: validate the config → build the actor mesh → run the app → close."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from forge_exp.config.store import register
from forge_exp.config.validate import validate

register()
log = logging.getLogger("forge_exp")


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
        run_name=config.tracking.run_name or config.name,
        tags=_run_tags(),
        parent_run_id=config.tracking.parent_run_id,
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


def _run_tags() -> dict[str, str]:
    tags = {"forge_exp.overrides": " ".join(HydraConfig.get().overrides.task) or "(defaults)"}
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
