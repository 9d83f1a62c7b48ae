"""The runs of run_mismatch.sh side by side: `python benchmarks/gpu/mismatch_table.py --bench BENCH --out OUT` reads
each BENCH/mismatch_<generator>_<mode>/mlflow.db, writes OUT/mismatch.json and prints a markdown table, one row a run
(generators, then modes, in run_mismatch.sh's order).

    step 1, numerics      mismatch/current/* at step 1: the rollouts were sampled by the weights step 1 starts from,
                          so Δ logp is the two engines' numerics alone (the same rollouts for every mode of a generator)
    later steps, all      medians over steps 2.. of mismatch/* over all tokens: numerics and up to max_policy_age
                          versions of staleness
    mode's effect         medians over all steps of loss/correction_* (absent for none), reward at the first and last
                          step, medians of the gradient norm and the step time
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from pathlib import Path

ORDER = ["torch", "vllm", "none", "tis", "mis", "seq_mask"]

COLUMNS = (  # (header, where, key, format)
    ("step-1 \\|Δ logp\\|", "first", "mismatch/current/logp_diff_abs_mean", "{:.2e}"),
    ("step-1 KL", "first", "mismatch/current/kl_k3", "{:.2e}"),
    ("step-1 ρ p01", "first", "mismatch/current/ratio_p01", "{:.4f}"),
    ("step-1 ρ p99", "first", "mismatch/current/ratio_p99", "{:.4f}"),
    ("step-1 ρ min", "first", "mismatch/current/ratio_min", "{:.3g}"),
    ("step-1 ρ max", "first", "mismatch/current/ratio_max", "{:.3g}"),
    ("later \\|Δ logp\\|", "later", "mismatch/logp_diff_abs_mean", "{:.2e}"),
    ("later KL", "later", "mismatch/kl_k3", "{:.2e}"),
    ("later ρ max", "later", "mismatch/ratio_max", "{:.3g}"),
    ("truncated", "all", "loss/correction_truncated_frac", "{:.2%}"),
    ("dropped", "all", "loss/correction_dropped_frac", "{:.2%}"),
    ("seqs dropped", "all", "loss/correction_dropped_seq_frac", "{:.2%}"),
    ("mean weight", "all", "loss/correction_weight_mean", "{:.4f}"),
    ("reward first", "first", "reward/mean", "{:.3f}"),
    ("reward last", "last", "reward/mean", "{:.3f}"),
    ("grad norm", "all", "train/grad_norm", "{:.3g}"),
    ("step (s)", "all", "time/step_seconds", "{:.2f}"),
)


def history(db: Path) -> dict[str, dict[int, float]]:
    """Every metric of the newest run in an MLflow sqlite store, by key and step."""
    con = sqlite3.connect(db)
    (run,) = con.execute("select run_uuid from runs order by start_time desc limit 1").fetchone()
    out: dict[str, dict[int, float]] = {}
    for key, step, value in con.execute("select key, step, value from metrics where run_uuid = ?", (run,)):
        out.setdefault(key, {})[step] = value
    return out


def cell(h: dict[str, dict[int, float]], where: str, key: str) -> float | None:
    series = h.get(key, {})
    if not series:
        return None
    steps = sorted(series)
    pick = {"first": steps[:1], "last": steps[-1:], "later": [s for s in steps if s > 1], "all": steps}[where]
    return statistics.median(series[s] for s in pick) if pick else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs = {}
    for db in args.bench.glob("mismatch_*/mlflow.db"):
        generator, mode = db.parent.name.removeprefix("mismatch_").split("_", 1)
        h = history(db)
        runs[db.parent.name] = {"generator": generator, "mode": mode, "steps": len(h.get("time/step_seconds", {})),
                                **{f"{where}:{key}": cell(h, where, key) for _, where, key, _ in COLUMNS}}
    rank = {name: i for i, name in enumerate(ORDER)}
    runs = dict(sorted(runs.items(), key=lambda kv: (rank.get(kv[1]["generator"], 99), rank.get(kv[1]["mode"], 99))))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mismatch.json").write_text(json.dumps({"runs": runs, "columns": [c[:3] for c in COLUMNS]}, indent=1))
    print("| generator | mode | steps | " + " | ".join(c[0] for c in COLUMNS) + " |")
    print("| --- | --- | --- |" + " --- |" * len(COLUMNS))
    for r in runs.values():
        cells = [fmt.format(r[f"{where}:{key}"]) if r[f"{where}:{key}"] is not None else "—"
                 for _, where, key, fmt in COLUMNS]
        print(f"| {r['generator']} | {r['mode']} | {r['steps']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
