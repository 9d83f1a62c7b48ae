"""Measure the default experiment (`forge-exp` with no arguments) on this machine: wall time, GRPO steps/s,
generation and training tokens/s, and peak memory of every process of the run (controller + Monarch procs).

    .venv/bin/python benchmarks/measure_default.py [--cached] [extra forge-exp overrides...]

Memory is sampled every 0.2 s over the whole process tree: the peak of the summed PSS (proportional set size:
shared pages split between the processes that map them, so the sum does not count torch's shared libraries once per
process) and, for comparison, of the summed RSS. Without --cached the warm start is trained (a cold first run);
with --cached it is loaded from the cache a previous run left. Results go to benchmarks/results/default_cpu.json
(default_cpu_cached.json), with the commit, and the composed config (`--cfg job`) beside them.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]


def tree_memory(pid: int) -> tuple[float, float, int]:
    """(PSS MiB, RSS MiB, process count) of pid and all its descendants."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0, 0
    pss = rss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
            pss, rss = pss + info.pss, rss + info.rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return pss / 2**20, rss / 2**20, len(procs)


def main() -> None:
    cached = "--cached" in sys.argv
    extra = [a for a in sys.argv[1:] if a != "--cached"]
    work = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    cache = ROOT / ".runtime" / "bench-warmstart" if cached else work / "cache"
    uri = f"sqlite:///{work}/mlflow.db"
    cmd = [str(ROOT / ".venv/bin/forge-exp"), f"hydra.run.dir={work}/run", f"tracking.uri={uri}",
           f"model.warmstart.cache_dir={cache}", "progress=false", *extra]
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_pss = peak_rss = 0.0
    peak_procs = 0
    while proc.poll() is None:
        pss, rss, n = tree_memory(proc.pid)
        peak_pss, peak_rss, peak_procs = max(peak_pss, pss), max(peak_rss, rss), max(peak_procs, n)
        time.sleep(0.2)
    wall = time.time() - start
    out = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"forge-exp failed:\n{out[-3000:]}")

    client = MlflowClient(uri)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    m = run.data.metrics
    trained = m.get("warmstart/steps") is not None
    if cached and trained:  # the first --cached run of a checkout fills the cache: it measured a cold start
        sys.exit(f"{cache} was empty: this run trained the warm start into it; run again to measure a cached start")

    def history(key: str) -> list[float]:
        return [x.value for x in sorted(client.get_metric_history(run.info.run_id, key), key=lambda x: x.step)]

    step_seconds = history("time/step_seconds")
    steps = len(step_seconds)
    median = sorted(step_seconds)[steps // 2]
    commit = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True)
    result = {
        "command": "forge-exp " + " ".join(extra) if extra else "forge-exp",
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(start)),
        "warm_start": "trained in this run" if trained else "cached",
        "machine": f"{platform.machine()}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "wall_seconds": round(wall, 1),
        "warmstart_seconds": round(m.get("warmstart/seconds", 0.0), 1),
        "warmstart_steps": m.get("warmstart/steps"),
        "grpo_steps": steps,
        "grpo_seconds": round(sum(step_seconds), 1),
        "grpo_steps_per_s": round(steps / sum(step_seconds), 2),
        "median_step_seconds": round(median, 3),
        "generation_tokens_per_s_median": round(sorted(history("generator/tokens_per_s"))[steps // 2], 0),
        "training_tokens_per_s_median": round(sorted(history("train/tokens_per_s"))[steps // 2], 0),
        "sync_seconds_median": round(sorted(history("sync/seconds"))[steps // 2], 4),
        "heldout_accuracy_start_of_grpo": m.get("summary/eval/accuracy_start"),
        "heldout_accuracy_end": m.get("summary/eval/accuracy_end"),
        "peak_memory_pss_mib_all_processes": round(peak_pss),
        "peak_memory_rss_mib_all_processes": round(peak_rss),
        "processes": peak_procs,
    }
    dest = ROOT / "benchmarks" / "results"
    dest.mkdir(exist_ok=True)
    name = "default_cpu_cached.json" if cached else "default_cpu.json"
    (dest / name).write_text(json.dumps(result, indent=2) + "\n")
    composed = subprocess.run([*cmd, "--cfg", "job"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    (dest / name.replace(".json", "_forge_exp_config.yaml")).write_text(composed)  # what the command composed
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
