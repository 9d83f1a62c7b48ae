"""Rollout throughput against the number of generator replicas and calls in flight: the sampling a GRPO step does
(apps/rollout.py: problems -> generator replicas -> reward workers), timed alone, no training beside it.

    .venv/bin/python benchmarks/rollouts.py                         # results/rollouts_cpu.json
    .venv/bin/python benchmarks/rollouts.py --batches 12 --max-new-tokens 32
    .venv/bin/python benchmarks/rollouts.py --max-new-tokens 32 algorithm.prompts_per_step=64   # + any overrides

Every layout runs in one process, each in its own Runtime (its proc meshes started and stopped), in rounds that
alternate the layouts so a slow spell of a shared machine hits them alike. Tokens/s counts sampled tokens over
the wall time of whole batches (prompts_per_step x group_size rows each); the first batches of a layout are warm-up.
The config is the embedded default's (tiny model, fresh weights, services=cpu: one torch thread per generator
process), with the layout's overrides; `--cfg job` of each is saved beside the results. `engine_alone` then times
the engine itself in this process over the whole batch and over half of it: the most two replicas can gain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from forge_exp.actors.dataset import DatasetService
from forge_exp.apps.common import RolloutPlan, generator_sizes
from forge_exp.apps.rollout import sample_groups
from forge_exp.config.compose import compose, typed
from forge_exp.runtime.layout import plan_for
from forge_exp.runtime.services import Runtime

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {  # name: overrides
    "1 replica, 1 call": ["services.generator.replicas=1", "services.generator.in_flight=1"],
    "2 replicas, 1 call each": ["services.generator.replicas=2", "services.generator.in_flight=1"],
    "1 replica, 2 calls": ["services.generator.replicas=1", "services.generator.in_flight=2"],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=8, help="timed batches per layout per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=8, help="the default's 8, or longer completions")
    p.add_argument("overrides", nargs="*", help="Hydra overrides applied to every layout")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollouts_cpu.json"))
    return p.parse_args()


async def measure(overrides: list[str], batches: int, warmup: int) -> dict:
    cfg = typed(overrides)
    a = cfg.algorithm
    async with Runtime(plan_for(cfg)) as runtime:
        dataset = runtime.spawn("dataset", DatasetService, cfg.dataset, cfg.model)
        plan = RolloutPlan.of(cfg)
        s = plan.samplers(plan.spawn_generator(runtime), plan.spawn_scorer(runtime))
        seconds, tokens = [], []
        for i in range(warmup + batches):
            problems = await dataset.route().sample.call_one(a.prompts_per_step)
            t0 = time.perf_counter()
            _, metrics = await sample_groups(s, problems, a.group_size, a.temperature, a.top_p)
            if i >= warmup:
                seconds.append(time.perf_counter() - t0)
                tokens.append(metrics["generator/tokens"])
    return {"seconds": seconds, "tokens": tokens}


async def _problems(cfg) -> list:
    async with Runtime(plan_for(cfg)) as runtime:
        dataset = runtime.spawn("dataset", DatasetService, cfg.dataset, cfg.model)
        return await dataset.route().sample.call_one(cfg.algorithm.prompts_per_step)


def engine_alone(overrides: list[str], problems: list, repeats: int) -> dict:
    """The engine a replica runs, in this process on one torch thread, over the whole batch and over half of it
    (what each of two replicas gets): full / half bounds what two replicas can gain, the rollout plumbing aside.
    Median process-time seconds of `repeats` calls each, interleaved."""
    from forge_exp.actors.generator import fill_unset
    from forge_exp.generators.base import Sampling
    from forge_exp.runtime.build import build

    cfg = typed(overrides)
    a = cfg.algorithm
    torch.set_num_threads(1)
    sizes = generator_sizes(cfg.algorithm, cfg.env, cfg.dataset)
    engine = build(fill_unset(cfg.generator, sizes), "generator", model=build(cfg.model, "model"),
                   device=torch.device("cpu"), seed=0)
    prompts = [engine.tokenizer.encode(p.prompt) for p in problems]
    sampling = Sampling(a.group_size, a.temperature, a.top_p, cfg.dataset.max_new_tokens, seed=1)
    times = {"full": [], "half": []}
    try:
        for _ in range(repeats):
            for name, batch in (("full", prompts), ("half", prompts[: len(prompts) // 2])):
                c0 = time.process_time()
                asyncio.run(engine.generate(batch, sampling))
                times[name].append(time.process_time() - c0)
    finally:
        engine.close()
    full, half = statistics.median(times["full"]), statistics.median(times["half"])
    return {"full_batch_seconds": round(full, 5), "half_batch_seconds": round(half, 5),
            "full_over_half": round(full / half, 2), "prompts": len(prompts), "repeats": repeats}


def main() -> None:
    args = parse_args()
    common = ["services=cpu", f"dataset.max_new_tokens={args.max_new_tokens}", *args.overrides]
    runs = {name: {"seconds": [], "tokens": []} for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, overrides in LAYOUTS.items():
            got = asyncio.run(measure(common + overrides, args.batches, args.warmup))
            for k in got:
                runs[name][k] += got[k]
    cfg = typed(common)
    problems = asyncio.run(_problems(cfg))
    alone = engine_alone(common, problems, repeats=15)
    print(f"engine alone: {alone}")
    base = sum(runs["1 replica, 1 call"]["tokens"]) / sum(runs["1 replica, 1 call"]["seconds"])
    table = {}
    for name, r in runs.items():
        rate = sum(r["tokens"]) / sum(r["seconds"])
        table[name] = {"tokens_per_s": round(rate), "vs_one_replica": round(rate / base, 2),
                       "median_batch_seconds": round(statistics.median(r["seconds"]), 4),
                       "batches": len(r["seconds"]), "overrides": common + LAYOUTS[name]}
        print(f"{name:26s} {rate:9.0f} tok/s  x{rate / base:.2f}  (median batch {statistics.median(r['seconds']):.3f} s)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": "python benchmarks/rollouts.py " + " ".join(
            [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "overrides")]
            + args.overrides),
        "commit": commit.strip(), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}",
        "what": "sampled tokens over the wall time of whole batches (generation + reward scoring), no training",
        "layouts": table,
        "engine_alone": alone,
    }, indent=1) + "\n")
    for name, overrides in LAYOUTS.items():  # the composed config of each layout, beside the numbers
        slug = name.split(",")[0].replace(" ", "_") + "_" + name.split(", ")[1].replace(" ", "_")
        cfg_path = out.with_name(f"{out.stem}_{slug}_config.yaml")
        cfg_path.write_text(OmegaConf.to_yaml(compose(common + overrides)))


if __name__ == "__main__":
    main()
