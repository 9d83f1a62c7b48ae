"""Where forge-exp's time and memory go at the tiny shape of benchmarks/lean/compare.py: a timeline of start-up and
shutdown, the per-step coordination, and what each process imports and holds.

    .venv/bin/python benchmarks/lean/profile_forge.py [--steps 100] [forge-exp overrides...]

The run is the real `forge-exp` (same shape, cached warm start), in a child process that wraps a few functions with
wall-clock timers before calling forge_exp.cli.main(): first imports of the heavy packages, config validation and
preflight, the MLflow Tracker's calls, proc-mesh spawns, every actor endpoint call the loop makes through a service
handle (`route().<endpoint>.call_one`), collate, the 2 ms polls, held-out evaluations, stopping the meshes. After
the last step a probe actor (probe.py) on every proc mesh reports its process's PSS and imported packages. Nothing
in forge_exp is changed. Also measured, each in a fresh interpreter: importing each actor's module.
Results: benchmarks/results/lean_profile.json.
"""

from __future__ import annotations

import time

T_MAIN = time.time()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import atexit  # noqa: E402
import builtins  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from compare import CACHE, SHAPE, commit, launch  # noqa: E402

EVENTS: list[dict] = []  # {"what", "start", "end"} in seconds since the process started
CALLS: list[tuple[str, float, float]] = []  # (service.endpoint, start, end)
POLLS: list[float] = []
WATCH = ("hydra", "omegaconf", "torch", "transformers", "mlflow", "monarch.actor", "forge_exp.apps.preflight",
         "forge_exp.tracking.mlflow", "forge_exp.apps.grpo", "forge_exp.runtime.services")
STATE: dict = {}


def p0() -> float:
    """The parent's clock just before it launched this process (the kernel's start time has ~1 s resolution)."""
    return float(os.environ["LEAN_LAUNCHED_AT"])


def event(what: str, start: float, end: float | None = None) -> None:
    EVENTS.append({"what": what, "start": round(start - STATE["p0"], 4), "end": round((end or start) - STATE["p0"], 4)})


def timed(what: str, fn):
    if asyncio.iscoroutinefunction(fn):
        async def wrapper(*a, **k):
            t0 = time.time()
            try:
                return await fn(*a, **k)
            finally:
                event(what, t0, time.time())
    else:
        def wrapper(*a, **k):
            t0 = time.time()
            try:
                return fn(*a, **k)
            finally:
                event(what, t0, time.time())
    return wrapper


class _Endpoint:
    def __init__(self, name, ep):
        self.name, self.ep = name, ep

    async def call_one(self, *a, **k):
        t0 = time.time()
        try:
            return await self.ep.call_one(*a, **k)
        finally:
            CALLS.append((self.name, t0 - STATE["p0"], time.time() - STATE["p0"]))

    def __getattr__(self, attr):
        return getattr(self.ep, attr)


class _Actors:
    def __init__(self, service, actors):
        self.service, self.actors = service, actors

    def __getattr__(self, attr):
        return _Endpoint(f"{self.service}.{attr}", getattr(self.actors, attr))


def on_import(name: str, module) -> None:
    if name == "forge_exp.apps.preflight":
        module.check = timed("preflight.check", module.check)
    elif name == "forge_exp.tracking.mlflow":
        t = module.Tracker
        for m in ("__init__", "_open", "log_params", "log_text", "log_table", "flush", "commit", "close"):
            if hasattr(t, m):  # an older tree (--src) has no _open
                setattr(t, m, timed(f"Tracker.{m}", getattr(t, m)))
    elif name == "forge_exp.runtime.services":
        r, s = module.Runtime, module.Service
        orig_route, orig_spawn, orig_this_host = s.route, r.spawn, module.this_host
        s.route = lambda self: _Actors(self.name, orig_route(self))

        def spawn(self, service, *a, **k):
            STATE["runtime"] = self
            t0 = time.time()
            out = orig_spawn(self, service, *a, **k)
            event(f"Runtime.spawn {service}", t0, time.time())
            return out
        r.spawn = spawn
        r.stop = timed("Runtime.stop (all meshes)", r.stop)

        class Host:  # times each spawn_procs
            def __init__(self, h):
                self.h = h

            def spawn_procs(self, *a, **k):
                t0 = time.time()
                out = self.h.spawn_procs(*a, **k)
                event(f"spawn_procs {k.get('name')}", t0, time.time())
                return out
        module.this_host = lambda: Host(orig_this_host())
    elif name == "forge_exp.apps.grpo":
        module.evaluate = timed("evaluate (held-out)", module.evaluate)
        module.collate_episodes = timed("collate_episodes", module.collate_episodes)
        module.to_episodes = timed("to_episodes", module.to_episodes)
        module.build = timed("grpo.build", module.build)
        train = module.train

        async def train_then_probe(*args, **kwargs):
            t0 = time.time()
            out = await train(*args, **kwargs)
            event("grpo.train", t0, time.time())
            t1 = time.time()
            await probe_all()
            event("probe (not forge-exp's)", t1, time.time())
            return out
        module.train = train_then_probe


async def probe_all() -> None:
    from probe import Probe, report

    runtime = STATE["runtime"]
    procs = {"controller": report()}
    for name, mesh in runtime.procs.items():
        actors = mesh.spawn("lean_probe", Probe)
        procs[f"mesh {name} ({', '.join(runtime.plans[name].services)})"] = await actors.report.call_one()
    STATE["procs"] = procs


def install() -> None:
    orig = builtins.__import__

    def hooked(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            fresh = [n for n in (name, *(f"{name}.{f}" for f in (fromlist or ()))) if n in WATCH and n not in sys.modules]
            if fresh:
                t0 = time.time()
                module = orig(name, globals, locals, fromlist, level)
                for n in fresh:
                    if n in sys.modules:
                        event(f"import {n}", t0, time.time())
                        on_import(n, sys.modules[n])
                return module
        return orig(name, globals, locals, fromlist, level)
    builtins.__import__ = hooked

    sleep = asyncio.sleep

    async def counted_sleep(delay, result=None):
        if delay == 0.002:  # the loop's polls (apps/grpo.py)
            POLLS.append(time.time() - STATE["p0"])
        return await sleep(delay, result)
    asyncio.sleep = counted_sleep


def child(out: str, argv: list[str]) -> None:
    STATE["p0"] = p0()
    event("profile script started", T_MAIN)
    install()
    t0 = time.time()
    import forge_exp.cli as cli  # noqa: PLC0415 — after the import hook is installed

    event("import forge_exp.cli", t0, time.time())
    cli.validate = timed("config.validate", cli.validate)

    def dump():
        event("atexit", time.time())
        import faulthandler  # what the interpreter does after the atexit hooks, every 0.5 s until it exits

        trace = open(Path(out).with_suffix(".exit-stacks.txt"), "w")  # noqa: SIM115 — open until the process ends
        faulthandler.dump_traceback_later(0.5, repeat=True, file=trace)
        Path(out).write_text(json.dumps({"p0": STATE["p0"], "events": EVENTS, "calls": CALLS, "polls": POLLS,
                                         "procs": STATE.get("procs", {})}))
    atexit.register(dump)
    sys.argv = ["forge-exp", *argv]
    cli.main()


def import_costs(src: str | None) -> dict:
    """Each service's actor module imported in a fresh interpreter: seconds, RSS, heavy packages loaded."""
    from probe import HEAVY

    code = ("import sys, time, importlib, psutil; t = time.perf_counter(); importlib.import_module(sys.argv[1]); "
            "dt = time.perf_counter() - t; m = psutil.Process().memory_full_info(); import json; "
            "print(json.dumps({'seconds': round(dt, 2), 'rss_mib': round(m.rss / 2**20), "
            f"'uss_mib': round(m.uss / 2**20), 'heavy': [h for h in {HEAVY!r} if h in sys.modules]}}))")
    out = {}
    modules = {"baseline (python + psutil)": "json"}
    modules |= {f"actor module: {s}": f"forge_exp.actors.{s}" for s in
                ("dataset", "reward", "replay_buffer", "generator", "trainer", "reference")}
    modules |= {"forge_exp.cli": "forge_exp.cli", "mlflow": "mlflow", "torch": "torch", "transformers": "transformers",
                "monarch.actor": "monarch.actor"}
    for label, module in modules.items():
        res = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", code, module], cwd=src or ROOT, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": src or ""})
        out[label] = json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr[-300:]}
    return out


def summarize(prof: dict, launched: dict, steps: int, metrics: dict) -> dict:
    shift = prof["p0"] - launched["launch"]  # the driver launched the child slightly before the kernel's start time
    first_step = min(s for e in prof["events"] if e["what"] == "grpo.train" for s in [e["start"]])
    per: dict[str, list[float]] = defaultdict(list)
    steady_from = None
    train_calls = sorted(c for c in prof["calls"] if c[0] == "trainer.train_step")
    if len(train_calls) > 10:
        steady_from, steady_to = train_calls[9][2], train_calls[-1][2]
    for name, s, e in prof["calls"]:
        if steady_from and steady_from <= s <= steady_to:
            per[name].append(e - s)
    for ev in prof["events"]:
        if steady_from and steady_from <= ev["start"] <= steady_to and ev["what"] in ("collate_episodes",
                                                                                       "to_episodes", "Tracker.flush"):
            per[ev["what"]].append(ev["end"] - ev["start"])
    n = len(train_calls) - 10
    polls = [t for t in prof["polls"] if steady_from and steady_from <= t <= steady_to]
    step_table = {k: {"calls_per_step": round(len(v) / n, 2), "ms_per_call_median": round(statistics.median(v) * 1e3, 2),
                      "ms_per_step": round(sum(v) / n * 1e3, 2)} for k, v in sorted(per.items())}
    step_table["2 ms polls"] = {"calls_per_step": round(len(polls) / n, 2)}
    return {
        "offset_launch_to_process_start_s": round(shift, 3),
        "timeline": [{**e, "start": round(e["start"] + shift, 3), "end": round(e["end"] + shift, 3)}
                     for e in sorted(prof["events"], key=lambda e: e["start"])],
        "first_calls": {name: round(min(e for n_, s, e in prof["calls"] if n_ == name) + shift, 3)
                        for name in sorted({c[0] for c in prof["calls"]})},
        "exit_s": round(launched["wall_s"], 3),
        "steady_steps": n,
        "steady_step_s": round((steady_to - steady_from) / (n - 1), 4) if n > 1 else None,
        "per_step": step_table,
        "actor_side_ms_median": metrics,
        "procs": prof["procs"],
        "grpo_train_start_s": round(first_step + shift, 3),
    }


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/lean_profile.json"))
    p.add_argument("--no-imports", action="store_true", help="skip the fresh-interpreter import measurements")
    p.add_argument("--fresh-store", action="store_true", help="let the run create its MLflow store (a first run)")
    p.add_argument("--src", default=None, help="profile the forge_exp of another source tree (see compare.py --src)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lean-profile-"))
    uri = f"sqlite:///{work}/mlflow.db"
    if not args.fresh_store:  # as a user's ./mlruns after the first run (a fresh store costs ~5 s CPU to create)
        from forge_exp.tracking.mlflow import ensure_store

        ensure_store(uri)
    forge_args = [*SHAPE, f"steps={args.steps}", "progress=false", f"hydra.run.dir={work}/run", f"tracking.uri={uri}",
                  f"model.warmstart.cache_dir={CACHE}", *args.overrides]
    cmd = [str(ROOT / ".venv/bin/python"), __file__, "--child", str(work / "profile.json"), *forge_args]
    path = os.pathsep.join([*([args.src] if args.src else []), str(HERE)])
    launched = launch(cmd, work / "out.txt", env={"PYTHONPATH": path, "LEAN_LAUNCHED_AT": repr(time.time())},
                      cwd=args.src or ROOT)  # procs start with `python -m`: the working directory leads their path
    prof = json.loads((work / "profile.json").read_text())

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    metrics = {}
    for key in ("generator/seconds", "train/seconds", "sync/seconds", "generator/sync_seconds", "time/wait_seconds",
                "time/step_seconds"):
        hist = [m.value for m in client.get_metric_history(run.info.run_id, key) if m.step > 10]
        if hist:
            metrics[key] = round(statistics.median(hist) * 1e3, 2)
    result = {"command": ".venv/bin/python benchmarks/lean/profile_forge.py " + " ".join(sys.argv[1:]),
              "commit": commit(ROOT), "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "load_avg_1min": os.getloadavg()[0],
              "peak_pss_mib": launched["peak_pss_mib"], "peak_processes": launched["peak_processes"],
              **summarize(prof, launched, args.steps, metrics),
              "mlflow_run_created_s": round(run.info.start_time / 1000 - launched["launch"], 3)}
    if not args.no_imports:
        result["imports_fresh_interpreter"] = import_costs(args.src)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
