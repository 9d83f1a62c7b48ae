"""forge-exp (the default layout) against TRL's single-process GRPOTrainer at one tiny shape, interleaved.

    bash benchmarks/lean/setup_trl.sh                       # once: the TRL venv (.venv-trl)
    .venv/bin/python benchmarks/lean/compare.py [--rounds 5] [--steps 100] [forge-exp overrides...]

The shape: the tiny Qwen3 (~0.59M parameters) from its cached warm start, 8 prompts × 8 completions × up to 8 new
tokens a step, the exact-answer arithmetic reward, no KL term, 100 steps. Each round runs, in turn: forge-exp
(max_policy_age=1, the default), TRL with 2 threads, forge-exp with max_policy_age=0 (no overlap of rollouts and
training), TRL with 1 thread, forge-exp with services=cpu_host (the light services in a process of their own
instead of the controller's). Interleaving keeps the ratios meaningful while the shared machine's speed drifts.

Per run, from the outside and from each side's own timestamps (time.time(); forge-exp's are the MLflow metric
timestamps of each step, TRL's a callback's, see trl_grpo.py):
  startup_s      process start → the first step begins (imports, config, processes, MLflow run, first weight
                 push, the first held-out evaluation for forge-exp)
  median_step_s  median interval between consecutive step ends, steps 11..N (steady state)
  shutdown_s     the last step ends → the process has exited (forge-exp: the final evaluation, artifacts,
                 stopping the procs)
  wall_s         process start → exit (the N steps end to end, start-up included)
  cpu_s          user + system CPU seconds of the run's processes, all of them (wait4): the work done, which the
                 other users of a shared machine do not inflate the way they inflate wall times
  peak_pss_mib   peak over the run of the summed PSS of the whole process tree, sampled every 0.5 s (PSS splits
                 shared pages between the processes mapping them, so torch's libraries are not counted per process)
Medians over rounds are reported, with forge-exp / TRL ratios (TRL: the faster of its two thread settings, per
metric). Results: benchmarks/results/lean_compare.json; the composed forge-exp config (`--cfg job`) beside it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / ".runtime" / "lean-warmstart"
# The shape, on top of the embedded default (tiny model, arithmetic task, services=cpu, warm start cached).
SHAPE = ["algorithm.prompts_per_step=8", "algorithm.group_size=8", "dataset.max_new_tokens=8",
         "algorithm.dynamic_sampling=false"]
SAMPLE_EVERY = 0.5
STEADY_FROM = 10  # intervals before this step are warm-up


def tree_memory(pid: int) -> tuple[float, float, list[tuple[str, float]]]:
    """(summed PSS MiB, summed RSS MiB, [(process, PSS MiB)]) of pid and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0, []
    pss = rss = 0.0
    each = []
    for p in procs:
        try:
            info = p.memory_full_info()
            name = " ".join(p.cmdline()[:3])[-60:]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss, rss = pss + info.pss / 2**20, rss + info.rss / 2**20
        each.append((name, round(info.pss / 2**20)))
    return pss, rss, each


def launch(cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: str | Path = ROOT) -> dict:
    """Run cmd to completion, sampling its process tree's memory on a thread; wall-clock launch and exit times. The
    exit is taken by a blocking wait4, so it is exact (a poll between samples would add up to SAMPLE_EVERY to it)."""
    with open(log, "w") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        peak = [(0.0, 0.0, [])]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(SAMPLE_EVERY):
                now = tree_memory(proc.pid)
                if now[0] > peak[0][0]:
                    peak[0] = now

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # wait4: the exit status and the CPU time of the process and of every descendant it reaped (the procs)
        _, status, usage = os.wait4(proc.pid, 0)
        t1 = time.time()
        done.set()
        sampler.join()
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here: Popen must not wait for it again
    if code != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed (exit {code}); see {log}:\n{log.read_text()[-3000:]}")
    pss, rss, each = peak[0]
    return {"launch": t0, "exit": t1, "wall_s": t1 - t0, "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_pss_mib": round(pss), "peak_rss_mib": round(rss), "peak_processes": each}


def commit(tree) -> str:
    """`<short hash> <subject>` of a source tree's checkout, marked when its files differ from that commit (the
    results this script and profile_forge.py write as they run do not count)."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)benchmarks/results"], capture_output=True, text=True)
    return head + (" + changes" if dirty.stdout.strip() else "")


def timing(launched: dict, step_begin_1: float, step_ends: list[float]) -> dict:
    ends = sorted(step_ends)
    intervals = [b - a for a, b in zip(ends, ends[1:])][STEADY_FROM - 1:]
    return {
        "startup_s": step_begin_1 - launched["launch"],
        "first_step_end_s": ends[0] - launched["launch"],
        "median_step_s": statistics.median(intervals),
        "shutdown_s": launched["exit"] - ends[-1],
        "steps": len(ends),
    }


def forge_cmd(work: Path, steps: int, extra: list[str], store: Path) -> list[str]:
    return [str(ROOT / ".venv/bin/forge-exp"), *SHAPE, f"steps={steps}", "progress=false",
            f"hydra.run.dir={work}/run", f"tracking.uri=sqlite:///{store}", f"model.warmstart.cache_dir={CACHE}",
            *extra]


def run_forge(steps: int, extra: list[str], tag: str, store: Path, src: str | None = None,
              env: dict[str, str] | None = None) -> dict:
    from mlflow.tracking import MlflowClient

    work = Path(tempfile.mkdtemp(prefix=f"lean-{tag}-"))
    # that tree's forge_exp ahead of the editable install, in every process (procs start with `python -m` in the
    # working directory, which Python puts first on their path)
    env = {**(env or {}), **({"PYTHONPATH": src} if src else {})}
    launched = launch(forge_cmd(work, steps, extra, store), work / "out.txt", env, cwd=src or ROOT)
    run_id = re.search(r"MLflow run (\w+) ", (work / "out.txt").read_text()).group(1)
    client = MlflowClient(f"sqlite:///{store}")
    run = client.get_run(run_id)
    hist = {m.step: m for m in client.get_metric_history(run.info.run_id, "time/step_seconds")}
    ends = [hist[s].timestamp / 1000 for s in sorted(hist)]
    m = run.data.metrics
    t = timing(launched, ends[0] - hist[min(hist)].value, ends)
    first_eval = client.get_metric_history(run.info.run_id, "eval/accuracy")
    return {**launched, **t, "mlflow_run_created_s": run.info.start_time / 1000 - launched["launch"],
            "first_eval_done_s": min(x.timestamp for x in first_eval) / 1000 - launched["launch"],
            "heldout_accuracy_start": m.get("summary/eval/accuracy_start"),
            "heldout_accuracy_end": m.get("summary/eval/accuracy_end"), "work": str(work)}


def run_trl(steps: int, threads: int, init: str, tag: str, venv: Path = ROOT / ".venv-trl") -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"lean-{tag}-"))
    cmd = [str(venv / "bin/python"), str(ROOT / "benchmarks/lean/trl_grpo.py"), "--steps", str(steps),
           "--threads", str(threads), "--init", init, "--timings", str(work / "timings.json")]
    launched = launch(cmd, work / "out.txt")
    d = json.loads((work / "timings.json").read_text())
    return {**launched, **timing(launched, d["step_begin"][0], d["step_end"]),
            "reward_first_log": d["reward_first_log"], "reward_last_log": d["reward_last_log"],
            "phases_ms": d.get("phases_ms"), "work": str(work)}


def summarize(runs: list[dict]) -> dict:
    keys = ("median_step_s", "startup_s", "first_step_end_s", "shutdown_s", "wall_s", "cpu_s", "peak_pss_mib",
            "peak_rss_mib",
            "mlflow_run_created_s", "first_eval_done_s", "heldout_accuracy_start", "heldout_accuracy_end")
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if r.get(k) is not None]
        if vals:
            out[k] = {"median": round(statistics.median(vals), 4), "min": round(min(vals), 4),
                      "max": round(max(vals), 4)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default=str(RESULTS / "lean_compare.json"))
    p.add_argument("--src", default=None, help="also run forge-exp (max_policy_age=1) from this source tree, with "
                   "this venv: a checkout of another commit, its conf/ and sweeps/ linked as forge_exp/conf and "
                   "forge_exp/sweeps (how the package ships them)")
    p.add_argument("--trl-venv", type=Path, default=ROOT / ".venv-trl", help="the TRL venv (setup_trl.sh's)")
    p.add_argument("--variants", "--only", default=None, help="comma-separated variants to run (default: all), "
                   "e.g. forge_age1,forge_age0,trl_1thread")
    p.add_argument("overrides", nargs="*", help="extra forge-exp overrides for every forge-exp run")
    args = p.parse_args()
    if not (args.trl_venv / "bin/python").exists():
        sys.exit(f"no {args.trl_venv}: run `bash benchmarks/lean/setup_trl.sh` first")

    # One MLflow store for every forge-exp run, as a user's ./mlruns: created here, before the timed runs (creating
    # a fresh sqlite store migrates its schema, ~5 s of CPU on this machine: a first run's cost, not a run's).
    store = Path(tempfile.mkdtemp(prefix="lean-mlflow-")) / "mlflow.db"
    work = Path(tempfile.mkdtemp(prefix="lean-warm-"))
    if not glob.glob(str(CACHE / "tiny-*" / "config.json")):
        print("training the warm start once (not timed)...", flush=True)
    launch(forge_cmd(work, 1, args.overrides, store), work / "out.txt")  # the warm start both sides start from
    init = sorted(glob.glob(str(CACHE / "tiny-*")))[0]
    config = subprocess.run(forge_cmd(Path("/tmp/unused"), args.steps, args.overrides, store) + ["--cfg", "job"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout

    def forge(*extra: str):
        return lambda tag: run_forge(args.steps, [*extra, *args.overrides], tag, store)

    variants = {  # name → how to run it; run in this order every round
        "forge_age1": forge("algorithm.max_policy_age=1"),
        "trl_2threads": lambda tag: run_trl(args.steps, 2, init, tag, args.trl_venv),
        "forge_age0": forge("algorithm.max_policy_age=0"),
        "trl_1thread": lambda tag: run_trl(args.steps, 1, init, tag, args.trl_venv),
        "forge_age1_cpu_host": forge("algorithm.max_policy_age=1", "services=cpu_host"),
        # procs started as fresh interpreters, not forked from the fork server (runtime/zygote.py)
        "forge_age1_no_fork_server": lambda tag: run_forge(args.steps, ["algorithm.max_policy_age=1", *args.overrides],
                                                           tag, store, env={"FORGE_EXP_FORK_SERVER": "0"}),
    }
    if args.src:  # the same default from another source tree, e.g. a checkout of the commit before a change
        variants["forge_age1_src"] = lambda tag: run_forge(args.steps, ["algorithm.max_policy_age=1", *args.overrides],
                                                           tag, store, args.src)
    if args.variants:
        variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, fn in variants.items():
            before = os.getloadavg()[0]
            res = fn(f"{name}-{r}")
            res["load_avg_1min_before"], res["load_avg_1min"] = before, os.getloadavg()[0]
            runs[name].append(res)
            print(f"round {r} {name}: step {res['median_step_s'] * 1000:.1f} ms, start-up {res['startup_s']:.2f} s, "
                  f"shutdown {res['shutdown_s']:.2f} s, wall {res['wall_s']:.1f} s, PSS {res['peak_pss_mib']} MiB",
                  flush=True)

    summary = {k: summarize(v) for k, v in runs.items()}
    ratios = {}
    trls = [k for k in ("trl_2threads", "trl_1thread") if k in summary]  # none: forge-exp against itself (--src)
    if trls:
        for metric in ("median_step_s", "startup_s", "shutdown_s", "wall_s", "cpu_s", "peak_pss_mib"):
            trl = min(summary[k][metric]["median"] for k in trls)
            for name in [v for v in variants if v.startswith("forge")]:
                ratios[f"{name}/{metric}"] = round(summary[name][metric]["median"] / trl, 2) if trl else None
    if "forge_age0" in summary:
        ratios["forge_age1/forge_age0 median_step_s"] = round(
            summary["forge_age1"]["median_step_s"]["median"] / summary["forge_age0"]["median_step_s"]["median"], 2)
    result = {
        "command": ".venv/bin/python benchmarks/lean/compare.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "commit": commit(ROOT),  # the tree the forge_age* variants ran (uncommitted changes: "+ changes")
        "src": args.src and commit(args.src),
        "shape": {"forge_exp_overrides": SHAPE + [f"steps={args.steps}", *args.overrides],
                  "trl": f"trl_grpo.py --steps {args.steps} --init <the same warm start>"},
        "summary": summary,
        "ratios_vs_best_trl": ratios,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_name(out.stem + "_forge_exp_config.yaml").write_text(config)
    print(json.dumps({"summary": summary, "ratios_vs_best_trl": ratios}, indent=2))


if __name__ == "__main__":
    main()
