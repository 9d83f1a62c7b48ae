"""GRPO step runs side by side: `python benchmarks/gpu/step_table.py OUT TAG...` reads OUT/<tag>.json
(summarize.py) for each tag that ran, writes OUT/steps.json and prints a markdown table: the step, the trainer
inside it, the generator beside it, the weight push, and where the step's wall time went (timeline/; means over
the measured steps). `side_by_side` also prints lora_table.py's table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROW = {  # summarize.py key: (label, scale, format)
    "step_seconds": ("step (s)", 1, "{:.2f}"),
    "wait_seconds": ("trainer waiting for a batch (s)", 1, "{:.2f}"),
    "train_seconds": ("training (s)", 1, "{:.2f}"),
    "train_tokens_per_s": ("training tokens/s", 1, "{:,.0f}"),
    "train_mfu": ("training MFU", 100, "{:.1f}%"),
    "generate_seconds": ("rollouts (s, generate calls)", 1, "{:.2f}"),
    "generation_tokens_per_s": ("generation tokens/s", 1, "{:,.0f}"),
    "weight_push_seconds": ("weight push (ms)", 1e3, "{:.1f}"),
    "weight_push_bytes": ("weight push (MiB)", 1 / 2**20, "{:,.1f}"),
    "weight_capture_seconds": ("of it, the trainer's snapshot (ms)", 1e3, "{:.1f}"),
    "generator_load_seconds": ("generator load (ms)", 1e3, "{:.1f}"),
    "peak_gib": ("peak GPU memory (GiB)", 1, "{:.1f}"),
    **{f"timeline_{p}": (f"timeline: {p} (s)", 1, "{:.2f}")
       for p in ("rollout", "reference", "train", "sync", "overlap", "idle")},
}
ROWS = ("step_seconds", "wait_seconds", "train_seconds", "train_mfu", "generate_seconds", "generation_tokens_per_s",
        "weight_push_seconds", "weight_capture_seconds", "generator_load_seconds", "peak_gib",
        *(k for k in ROW if k.startswith("timeline_")))


def side_by_side(out: Path, tags: dict[str, str], rows: tuple[str, ...], name: str) -> None:
    """Read OUT/<tag>.json of each tag that ran, write OUT/<name> (the values of `rows`, keys of ROW, and the
    commands) and print the table, one column per tag (headed by its label in `tags`)."""
    runs = {t: json.loads((out / f"{t}.json").read_text()) for t in tags if (out / f"{t}.json").is_file()}
    for r in runs.values():
        per_gpu = r.get("peak_used_mib_per_gpu") or {}  # summarize.py's memory() (nvidia-smi; none on CPU)
        r["peak_gib"] = max(per_gpu.values()) / 1024 if per_gpu else None
        r.update({f"timeline_{k}": v for k, v in (r.get("timeline_seconds") or {}).items()})
    table = {t: {key: r.get(key) for key in rows} for t, r in runs.items()}
    (out / name).write_text(json.dumps({"runs": table, "commands": {t: r["command"] for t, r in runs.items()}},
                                       indent=1))
    print("| | " + " | ".join(tags[t] for t in runs) + " |")
    print("| --- |" + " ---: |" * len(runs))
    for key in rows:
        label, scale, fmt = ROW[key]
        cells = [fmt.format(r[key] * scale) if isinstance(r.get(key), (int, float)) and r[key] == r[key] else "—"
                 for r in runs.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    side_by_side(Path(sys.argv[1]), {t: t for t in sys.argv[2:]}, ROWS, "steps.json")
