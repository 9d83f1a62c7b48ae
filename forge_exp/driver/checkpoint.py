"""Training checkpoints for resume: where they live, which is newest, what a resumed run continues from.

A checkpoint is a directory `<checkpoint dir>/step_<N>` holding the policy in HF format (loadable by transformers),
the optimizer state, `state.json` (the step, the MLflow run id and the metrics of the steps since the previous
checkpoint) and, for GRPO, `loop.json`: what the loop had that the weights do not say — the prompt stream's
position, the episodes waiting in the replay buffer and its RNG, the rollout metrics of those batches. Rollouts
draw with a seed made of (run seed, batch, call) (`rollout_seed`), so with `algorithm.max_policy_age=0` a resumed
run is bit for bit the run that was not interrupted (tests/faults/test_resume_exact.py).

Those metrics reach MLflow only after the checkpoint is on disk (and are re-sent on resume if the run died in
between), so a resumed run logs every step exactly once. A save killed half-way leaves a hidden temporary
directory or a step directory without state.json; `clean_partial()` removes them when a run starts.

A checkpoint's last file is its manifest (models/checkpoint.py: the size and sha256 of every file). `latest()`
returns the newest checkpoint that is intact; newer damaged ones (a crash before the data reached the disk, a full
disk, a copy cut short, a state.json that does not parse) are reported with the file and the reason, and a resume
continues from the older one (`set_aside` moves the damaged out of the way). The steps the damaged one had logged
are trained again but not logged again (tracking/mlflow.py: the resumed run's rewind).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from forge_exp.models.checkpoint import verify_manifest
from forge_exp.models.sampling import derive_seed

STATE = "state.json"
LOOP = "loop.json"
FLUSHED = "metrics_flushed"


@dataclass
class ResumeState:
    step: int
    run_id: str
    path: Path
    tracking_uri: str | None = None  # the store the run was logged to (None in checkpoints older than the field)
    pending_metrics: list[tuple[str, float, int, int]] = field(default_factory=list)  # (key, value, ts, step)
    loop: dict | None = None  # loop.json: None for a checkpoint without it (SFT, or written before it existed)

    @property
    def flushed(self) -> bool:
        return (self.path / FLUSHED).exists()

    def mark_flushed(self) -> None:
        (self.path / FLUSHED).touch()


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def latest(root: str | Path | None, damaged: list[tuple[Path, str]] | None = None,
           verify: bool = True) -> ResumeState | None:
    """The newest intact checkpoint under root (state.json there, every file as its manifest says, the JSON files
    readable), or None. Newer damaged ones are appended to `damaged` as (path, what is wrong). verify=False reads
    the JSON files only (quick: no file is hashed)."""
    if root is None or not Path(root).is_dir():
        return None
    for path in reversed(_complete(root)):
        try:
            if verify and (why := verify_manifest(path)):
                raise ValueError(why)
            state = _json(path / STATE)
            loop = _json(path / LOOP) if (path / LOOP).is_file() else None
            return ResumeState(
                step=state["step"], run_id=state["run_id"], path=path, tracking_uri=state.get("tracking_uri"),
                pending_metrics=[tuple(m) for m in state.get("pending_metrics", [])], loop=loop,
            )
        except (ValueError, KeyError, TypeError) as e:
            if damaged is not None:
                damaged.append((path, str(e) if isinstance(e, ValueError) else f"{STATE} lacks {e}"))
    return None


def resume_point(config) -> tuple[ResumeState | None, list[tuple[Path, str]]]:
    """What this run continues: with resume=true the newest intact checkpoint of checkpoint.dir (and the damaged
    newer ones, for set_aside), else nothing; a ValueError when there is none to resume, or when a fresh run would
    overwrite another run's checkpoints."""
    root, damaged = config.checkpoint.dir, []
    resume = latest(root, damaged) if config.resume else None
    if config.resume and resume is None and damaged:
        raise ValueError(f"resume=true: no intact checkpoint in {root} (checkpoint.dir): " +
                         "; ".join(f"{path.name}: {why}" for path, why in damaged))
    if config.resume and resume is None:
        raise ValueError(f"resume=true: no checkpoint in {root} (checkpoint.dir); resume continues a run in its own "
                         f"run dir: give hydra.run.dir=<that run's dir> (the default dir is new for every command) "
                         f"and run it with checkpoint.every > 0")
    if not config.resume and config.checkpoint.every and (earlier := latest(root)):
        raise ValueError(f"checkpoint.dir={root} holds the checkpoints of MLflow run {earlier.run_id} (the newest: "
                         f"step {earlier.step}), which this run would overwrite: continue that run with resume=true, "
                         f"or start this one in another hydra.run.dir")
    return resume, damaged


def _complete(root: str | Path) -> list[Path]:
    """The step directories under root that a save finished (state.json written), oldest first."""
    done = (p for p in Path(root).iterdir() if re.fullmatch(r"step_\d+", p.name) and (p / STATE).is_file())
    return sorted(done, key=lambda p: int(p.name[5:]))


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except ValueError as e:  # UnicodeDecodeError too
        raise ValueError(f"{path.name} is not valid JSON ({e})") from None


def set_aside(damaged: list[tuple[Path, str]]) -> list[str]:
    """Move damaged checkpoints to step_N.damaged (kept to look at; never resumed from or pruned); what was done,
    one line each."""
    lines = []
    for path, why in damaged:
        aside = path.with_name(f"{path.name}.damaged")
        n = 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.name}.damaged{n}")
        path.rename(aside)
        lines.append(f"checkpoint {path} is damaged ({why}); moved to {aside.name}")
    return lines


# What a resume may change: how long and where the run goes on, how it is evaluated, checkpointed and tracked, how
# it is laid out over processes (a sharded checkpoint reshards on load), where the warm start is cached; not what it
# trains (model, algorithm, data, rewards, engines, seed), nor the warm start's settings (they made the initial
# policy, which the reference model of a run with the KL term reads again on resume). Exact keys, then prefixes.
RESUME_MAY_CHANGE = ("steps", "progress", "output_dir", "model.warmstart.cache_dir")
RESUME_MAY_CHANGE_UNDER = ("eval.", "checkpoint.", "tracking.", "logger.", "services.", "cluster.", "parallelism.")


def config_changes(params: dict[str, str], resolved: dict) -> dict[str, tuple[str, str]]:
    """How this command's config differs from the run's (its MLflow params, logged at its first start, the way
    the tracker logs them): {key: (the run's, this one's)} for keys a resume may change; a ValueError naming the
    others. Keys one of them lacks (added or removed by a newer forge-exp) are not compared."""
    from forge_exp.tracking.mlflow import MAX_PARAM_LEN, flatten

    now = {k: str(v)[:MAX_PARAM_LEN] for k, v in flatten(resolved).items()}
    changed = {k: (params[k], v) for k, v in now.items() if k in params and params[k] != v and k != "resume"}
    refused = [k for k in changed if k not in RESUME_MAY_CHANGE and not k.startswith(RESUME_MAY_CHANGE_UNDER)]
    if refused:
        shown = ", ".join(f"{k}={changed[k][1]} (the run has {changed[k][0]})" for k in refused[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        raise ValueError(f"resume=true: {shown}{more}: a resume continues the same training; give the run's values, "
                         f"or start a new run in another hydra.run.dir (a resume may change "
                         f"{', '.join(RESUME_MAY_CHANGE[:2])}, {', '.join(p + '*' for p in RESUME_MAY_CHANGE_UNDER)})")
    return changed


def clean_partial(root: str | Path | None) -> list[str]:
    """Remove what a save killed half-way left under root: its hidden temporary directories (`.step_N.*`) and step
    directories without state.json. Returns their names. Call it before the run writes checkpoints."""
    if root is None or not Path(root).is_dir():
        return []
    removed = []
    for p in Path(root).iterdir():
        partial_tmp = p.name.startswith(".step_") and p.is_dir()
        incomplete = re.fullmatch(r"step_\d+", p.name) and p.is_dir() and not (p / STATE).is_file()
        if partial_tmp or incomplete:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return sorted(removed)


def state_metadata(step: int, run_id: str, pending_metrics: list, tracking_uri: str | None = None) -> dict:
    return {STATE: {"step": step, "run_id": run_id, "tracking_uri": tracking_uri, "pending_metrics": pending_metrics}}


def prune(root: str | Path, keep: int) -> None:
    """Remove all but the newest `keep` checkpoints."""
    done = _complete(root)
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


async def save_checkpoint(checkpoint, trainer, tracker, step: int, loop: dict | None = None) -> Path:
    """Weights + optimizer + the metrics since the last checkpoint (+ the loop's state) under `checkpoint.dir` (the
    config's checkpoint node); the metrics go to MLflow once it is on disk."""
    pending = tracker.take_pending()
    path = step_dir(checkpoint.dir, step)
    metadata = state_metadata(step, tracker.run_id, pending, tracker.uri)
    if loop is not None:
        metadata[LOOP] = loop  # (state.json is what marks the directory complete, whatever the write order)
    await trainer.route().save.call_one(str(path), metadata)
    if tracker.send(pending):  # else kept by the tracker, and re-sent from state.json by a resume
        (path / FLUSHED).touch()
    prune(checkpoint.dir, checkpoint.keep)
    return path


# --- what the GRPO loop adds ----------------------------------------------------------------------------------
def rollout_seed(seed: int, batch: int, call: int) -> int:
    """The sampling seed of a batch's `call`-th generate call: the same in every process, run and schedule."""
    return derive_seed("rollout", seed, batch, call)

