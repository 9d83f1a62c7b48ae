"""A summarize.py JSON of a run summarized before its step figures were means (they were medians): the same figures
as means over the measured steps, from the run's own per-step series (`per_step`), which every such JSON keeps.

    python benchmarks/gpu/remean.py RUN.json [RUN.json ...]     # prints {run: {figure: mean}} as JSON

MFU scales with 1 / training seconds (the FLOPs and the measured matmul rate are the run's own); peak memory is not
a per-step figure and stays as it was.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

FIGURES = {  # summarize.py key: its per-step metric
    "step_seconds": "time/step_seconds", "wait_seconds": "time/wait_seconds", "train_seconds": "train/seconds",
    "generate_seconds": "generator/seconds", "generation_tokens_per_s": "generator/tokens_per_s",
    "weight_push_seconds": "sync/seconds", "generator_load_seconds": "generator/sync_seconds",
    "train_policy_age": "train/policy_age",
    **{f"timeline_{p}": f"timeline/{p}_seconds" for p in ("rollout", "reference", "train", "sync", "overlap", "idle")},
}


def means(run: dict) -> dict[str, float]:
    first, last = (int(x) for x in run["steps_measured"].split(".."))
    per_step = run["per_step"]
    out = {}
    for figure, metric in FIGURES.items():
        values = [v for step, v in enumerate(per_step.get(metric, []), 1) if first <= step <= last and v is not None]
        if values:
            out[figure] = statistics.fmean(values)
    if run.get("train_mfu") and run.get("train_seconds") and out.get("train_seconds"):
        out["train_mfu"] = run["train_mfu"] * run["train_seconds"] / out["train_seconds"]
    out["steps"] = run["steps_measured"]
    return out


if __name__ == "__main__":
    print(json.dumps({Path(p).stem: means(json.loads(Path(p).read_text())) for p in sys.argv[1:]}, indent=1))
