"""The real-model benchmark's table and curves, from forge-exp's MLflow store and TRL's log (trl_grpo.py --out).

    python benchmarks/real/summarize.py --db RUN/mlflow.db [--trl trl.json] --config forge.config.yaml \
        --command "forge-exp ..." --out real_h200.json --plot real_h200.png

forge-exp's training time at step s is the sum of `time/step_seconds` up to s: each step from taking its batch to
its weights being on the generators, evaluations excluded (TRL's side excludes its evaluations the same way). Both
start their clock at the first step: start-up (processes, model loading) is reported on its own line.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

SERIES = {  # what the curves show: forge-exp's metric, TRL's log key
    "reward": ("reward/mean", "reward"),
    "kl": ("loss/kl", "kl"),
    "entropy": ("policy/entropy", "entropy"),
    "response length (tokens)": ("rollout/response_length", "length"),
}


def forge_run(db: str) -> dict:
    """The newest run's metrics: {key: [(step, value), ...]} and its start/end times."""
    con = sqlite3.connect(db)
    run_id, start, end = con.execute("select run_uuid, start_time, end_time from runs order by start_time desc "
                                     "limit 1").fetchone()
    metrics: dict[str, list] = {}
    for key, value, step in con.execute("select key, value, step from metrics where run_uuid=? order by step",
                                        (run_id,)):
        metrics.setdefault(key, []).append((step, value))
    return {"run_id": run_id, "metrics": metrics, "seconds": ((end or start) - start) / 1e3}


def forge_curves(run: dict) -> dict:
    m = run["metrics"]
    elapsed, total = {0: 0.0}, 0.0
    for step, seconds in m.get("time/step_seconds", []):
        total += seconds
        elapsed[step] = total
    evals = []
    for step, acc in m.get("eval/accuracy", []):
        per_task = {k.split("/")[1]: v for k, series in m.items() if k.startswith("eval/") and k.endswith("/accuracy")
                    and k != "eval/accuracy" for s, v in series if s == step}
        evals.append({"step": step, "train_seconds": elapsed.get(step, total), "accuracy": acc,
                      **{f"{t}/accuracy": v for t, v in per_task.items()}})
    steps = [{"step": s, "train_seconds": elapsed[s], **{name: dict(m.get(key, [])).get(s) for name, (key, _) in
                                                          SERIES.items()}} for s in sorted(elapsed) if s]
    return {"evals": evals, "steps": steps}


def trl_curves(log: dict) -> dict:
    steps = [{"step": s["step"], "train_seconds": s["train_seconds"],
              **{name: s.get(key) for name, (_, key) in SERIES.items()}} for s in log["steps"]]
    return {"evals": log["evals"], "steps": steps}


def time_to(evals: list[dict], accuracy: float) -> float | None:
    """Training seconds at the first evaluation reaching `accuracy`."""
    return next((e["train_seconds"] for e in evals if e["accuracy"] >= accuracy - 1e-9), None)


def table(sides: dict[str, dict]) -> dict:
    out = {}
    for name, side in sides.items():
        first, last = side["evals"][0], side["evals"][-1]
        out[name] = {"accuracy_start": first["accuracy"], "accuracy_end": last["accuracy"],
                     "gain": last["accuracy"] - first["accuracy"], "steps": last["step"],
                     "train_seconds": last["train_seconds"],
                     "seconds_per_step": last["train_seconds"] / max(last["step"], 1),
                     "per_task": {k.split("/")[0]: (first.get(k), last.get(k)) for k in last if k.endswith("/accuracy")}}
    if "trl" in sides and "forge-exp" in sides:
        target = out["trl"]["accuracy_end"]
        # TRL's final accuracy, reached by forge-exp after its start (a TRL run that learned nothing gives no ratio)
        reach = time_to(sides["forge-exp"]["evals"][1:], target) if target > out["trl"]["accuracy_start"] else None
        out["forge-exp reaches TRL's final accuracy"] = {
            "trl_final_accuracy": target, "forge_exp_seconds": reach, "trl_seconds": out["trl"]["train_seconds"],
            "ratio": None if reach is None else reach / out["trl"]["train_seconds"]}
    return out


def plot(sides: dict[str, dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    colors = {"forge-exp": "tab:blue", "trl": "tab:orange"}
    ax = axes[0][0]
    for name, side in sides.items():
        e = side["evals"]
        ax.plot([x["train_seconds"] for x in e], [x["accuracy"] for x in e], "o-", color=colors[name], label=name)
        for task in sorted({k for x in e for k in x if k.endswith("/accuracy")}):
            ax.plot([x["train_seconds"] for x in e], [x.get(task) for x in e], ":", color=colors[name], alpha=0.6,
                    label=f"{name} {task.split('/')[0]}")
    ax.set(xlabel="training seconds (evaluation excluded)", ylabel="held-out accuracy (greedy)")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for name, side in sides.items():
        ax.plot([x["step"] for x in side["evals"]], [x["accuracy"] for x in side["evals"]], "o-", color=colors[name],
                label=name)
    ax.set(xlabel="step", ylabel="held-out accuracy (greedy)")
    ax.legend(fontsize=7)
    for ax, series in zip([axes[0][2], *axes[1]], SERIES):
        for name, side in sides.items():
            points = [(x["step"], x[series]) for x in side["steps"] if x.get(series) is not None]
            if points:
                ax.plot(*zip(*points), color=colors[name], label=name, lw=1)
        ax.set(xlabel="step", ylabel=series)
        ax.legend(fontsize=7)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 200)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True)
    p.add_argument("--trl", default=None)
    p.add_argument("--config", required=True, help="forge-exp ... --cfg job of the run")
    p.add_argument("--command", required=True)
    p.add_argument("--device", default="")
    p.add_argument("--out", required=True)
    p.add_argument("--plot", default=None)
    args = p.parse_args()
    run = forge_run(args.db)
    sides = {"forge-exp": forge_curves(run)}
    trl = json.loads(Path(args.trl).read_text()) if args.trl and Path(args.trl).exists() else None
    if trl:
        sides["trl"] = trl_curves(trl)
    result = {"command": args.command, "device": args.device or (trl or {}).get("device", ""),
              "forge_exp_run": run["run_id"], "forge_exp_wall_seconds": run["seconds"], "table": table(sides),
              "curves": sides, "trl_config": (trl or {}).get("trl_config"),
              "forge_exp_config": Path(args.config).read_text()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["table"], indent=1))
    if args.plot:
        plot(sides, args.plot, args.command)


if __name__ == "__main__":
    main()
