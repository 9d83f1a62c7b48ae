"""Training checkpoints for resume: where they live, which is newest, what a resumed run continues from.

A checkpoint is a directory `<checkpoint dir>/step_<N>` holding the policy in HF format (loadable by transformers),
the optimizer state, and `state.json`: the step, the MLflow run id and the metrics of the steps since the previous
checkpoint. Those metrics reach MLflow only after the checkpoint is on disk (and are re-sent on resume if the run
died in between), so a resumed run logs every step exactly once.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

STATE = "state.json"
FLUSHED = "metrics_flushed"


@dataclass
class ResumeState:
    step: int
    run_id: str
    path: Path
    pending_metrics: list[tuple[str, float, int, int]] = field(default_factory=list)  # (key, value, ts, step)

    @property
    def flushed(self) -> bool:
        return (self.path / FLUSHED).exists()

    def mark_flushed(self) -> None:
        (self.path / FLUSHED).touch()


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def latest(root: str | Path | None) -> ResumeState | None:
    """The newest complete checkpoint under root (one with state.json), or None."""
    if root is None or not Path(root).is_dir():
        return None
    done = sorted(
        (p for p in Path(root).iterdir() if re.fullmatch(r"step_\d+", p.name) and (p / STATE).is_file()),
        key=lambda p: int(p.name[5:]),
    )
    if not done:
        return None
    state = json.loads((done[-1] / STATE).read_text())
    return ResumeState(
        step=state["step"], run_id=state["run_id"], path=done[-1],
        pending_metrics=[tuple(m) for m in state.get("pending_metrics", [])],
    )


def state_metadata(step: int, run_id: str, pending_metrics: list) -> dict:
    return {STATE: {"step": step, "run_id": run_id, "pending_metrics": pending_metrics}}


def prune(root: str | Path, keep: int) -> None:
    """Remove all but the newest `keep` checkpoints."""
    done = sorted((p for p in Path(root).glob("step_*") if (p / STATE).is_file()), key=lambda p: int(p.name[5:]))
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


async def save_checkpoint(cfg, trainer, tracker, step: int) -> None:
    """Weights + optimizer + the metrics since the last checkpoint; the metrics go to MLflow once it is on disk."""
    pending = tracker.take_pending()
    path = step_dir(cfg.checkpoint.dir, step)
    await trainer.route().save.call_one(str(path), state_metadata(step, tracker.run_id, pending))
    tracker.send(pending)
    (path / FLUSHED).touch()
    prune(cfg.checkpoint.dir, cfg.checkpoint.keep)
