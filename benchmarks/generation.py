"""Generation throughput of every engine at the two RL shapes, against the memory floor, measured in one call.

    python benchmarks/generation.py --out /tmp/generation.json --commit <sha>       # on one GPU (~5 min)
    python benchmarks/generation.py --cpu-tiny --out benchmarks/results/generation_cpu.json --baseline-rev <sha>

GPU: a random-weight model of the Qwen3-1.7B shape (hidden 2048, 28 layers, 16 q / 8 kv heads of 128, MLP 6144,
vocab 151936, tied embeddings; bf16), prompts of random token ids, temperature 1, top_p 1, EOS off, so every
engine produces batch x max_new_tokens tokens; tokens/s is end to end (prefill included). Engines: HF eager
`generate` (DynamicCache), HF static cache + torch.compile (reduce-overhead), the native engine, vLLM when
importable. Floor: a decode step must read the weights once and each row's live KV once; over the
device-to-device copy bandwidth measured in the same call, that is the fastest possible tokens/s.
Before timing, `checks` runs the Triton kernels against the torch ops and the engine against the eager path on
the GPU (float32), so a fast wrong engine cannot pass unnoticed.

--cpu-tiny: the default experiment's generation (tiny model, 32 prompts x 8 samples = 256 rows x 8 new tokens, one
thread): the eager path, the native engine and, with --baseline-rev, `generate` as it was at that commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.generation_engines import (  # noqa: E402
    SHAPES, _VLLM, close_vllm, copy_bandwidth, floor_tokens_per_s, qwen3_1_7b, run_hf, run_native, run_vllm, vllm_sync,
)
from benchmarks.generation_kernels import checks, profile_native, sweep  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402
from forge_exp.models.generate import generate  # noqa: E402


def gpu(args) -> dict:
    device = "cuda"
    t_start = time.perf_counter()
    left = lambda: args.deadline_s - (time.perf_counter() - t_start)  # noqa: E731
    result = {"commit": args.commit, "machine": torch.cuda.get_device_name(), "torch": torch.__version__,
              "python": platform.python_version()}
    import transformers

    result["transformers"] = transformers.__version__
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        result["triton"] = None
    bandwidth = copy_bandwidth(device)
    result["ceilings"] = {"copy_bandwidth_bytes_per_s": bandwidth}
    if not args.skip_checks:
        result["checks"] = checks(device)
        print("checks", json.dumps(result["checks"]), flush=True)
    model = qwen3_1_7b(device)
    result["model"] = {"parameters": sum(p.numel() for p in model.parameters()), "dtype": "bfloat16"}
    if args.sweep:
        result["sweep"] = [sweep(model, bandwidth, *shape) for shape in SHAPES]
        for shape in result["sweep"]:
            print(shape["shape"], "in use", json.dumps(shape["attention_default"]))
            print(shape["shape"], "fastest", json.dumps(shape["attention"][:3]), flush=True)
        result["runs"] = []
        return result
    runs = []
    engines = args.engines.split(",")
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")] if args.shapes else SHAPES
    for batch, prompt, new in shapes:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(3, 151936, (batch, prompt), generator=g).tolist()
        floor = floor_tokens_per_s(model, batch, prompt, new, bandwidth)
        for name in engines:
            row = {"shape": f"{batch}x{prompt}->{new}", "engine": name, "floor_tokens_per_s": floor["tokens_per_s"]}
            need = {"hf_eager": 40, "hf_compile": 150}.get(name, 20)
            if left() < need:
                row["status"] = f"skipped: {left():.0f} s left of --deadline-s"
            else:
                try:
                    if name == "native":
                        row.update(run_native(model, prompts, new))
                    elif name == "native_groups8":  # GRPO's rows: batch / 8 prompts, 8 samples each
                        row.update(run_native(model, prompts, new, group=8))
                    elif name == "native_groups8_copies":  # the same, each sample reading its own copy of the prompt
                        row.update(run_native(model, prompts, new, group=8, share_prompt_kv=False))
                    elif name == "native_sync64":
                        row.update(run_native(model, prompts, new, sync_every=64))
                    elif name == "native_no_lookahead":  # the host reads each chunk back before queuing the next
                        row.update(run_native(model, prompts, new, lookahead=False))
                    elif name == "hf_eager":
                        row.update(run_hf(model, prompts, new, compiled=False))
                    elif name == "hf_compile":
                        row.update(run_hf(model, prompts, new, compiled=True))
                    elif name == "vllm":
                        row.update(run_vllm(model, prompts, new))
                    elif name == "native_profile":
                        row.update(profile_native(model, prompts, min(new, 128)))
                except Exception as error:  # one engine failing must not lose the others' numbers
                    row["status"] = f"failed: {type(error).__name__}: {error}"[:600]
            if "seconds" in row:
                row["tokens_per_s"] = row["tokens"] / row["seconds"]
                row["fraction_of_floor"] = row["tokens_per_s"] / floor["tokens_per_s"]
            runs.append(row)
            print(json.dumps(row), flush=True)
        result.setdefault("floors", {})[f"{batch}x{prompt}->{new}"] = floor
    if _VLLM:
        try:
            runs.append(vllm_sync(model, prompts))
        except Exception as error:
            runs.append({"engine": "vllm_sync", "status": f"failed: {type(error).__name__}: {error}"[:600]})
        print(json.dumps(runs[-1]), flush=True)
        close_vllm()
    result["runs"] = runs
    result["wall_seconds"] = time.perf_counter() - t_start
    return result


def cpu_tiny(args) -> dict:
    """The default experiment's generation on one CPU thread: interleaved runs, best of --repeats (process time)."""
    from forge_exp.models.tiny import TinyQwen3

    import random

    torch.set_num_threads(1)
    cfg = TinyQwen3()
    model, tok = cfg.build(), cfg.tokenizer()
    rng = random.Random(0)  # one GRPO step of the default experiment: 32 problems x group_size 8 = 256 rows
    prompts = [tok(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=")["input_ids"] for _ in range(32)]
    rows = [p for p in prompts for _ in range(8)]  # how the generator actor calls the eager path
    engine = NativeEngine(cfg, "cpu", 0, eos_token_ids=[])
    fns = {"eager generate": lambda: generate(model, rows, max_new_tokens=8, eos_id=-1, pad_id=0, seed=1),
           "native engine": lambda: asyncio.run(engine.generate(prompts, Sampling(n=8, max_new_tokens=8, seed=1)))}
    if args.baseline_rev:
        import subprocess
        import types

        source = subprocess.run(["git", "show", f"{args.baseline_rev}:forge_exp/models/generate.py"], check=True,
                                capture_output=True, text=True).stdout
        old = types.ModuleType("generate_before")
        exec(compile(source, "generate_before", "exec"), old.__dict__)
        fns[f"generate at {args.baseline_rev}"] = lambda: old.generate(
            model, rows, max_new_tokens=8, eos_id=-1, pad_id=0, generator=torch.Generator().manual_seed(1))
    times = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm-up
    for _ in range(args.repeats):
        for k, f in fns.items():
            t0 = time.process_time()
            f()
            times[k].append(time.process_time() - t0)
    stats = dict(engine.stats, prefill_tokens=engine.runner.prefill_tokens)
    engine.close()
    tokens = 256 * 8
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else ""
    return {"commit": args.commit, "machine": f"{cpu}, {os.cpu_count()} cores", "threads": 1,
            "torch": torch.__version__, "rows": 256, "distinct_prompts": 32, "new_tokens": 8, "repeats": args.repeats,
            "native_engine_stats": stats,
            "runs": [{"engine": k, "best_tokens_per_s": tokens / min(v), "median_tokens_per_s":
                      tokens / statistics.median(v)} for k, v in times.items()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--engines", default="native,native_sync64,hf_eager,hf_compile,vllm")
    parser.add_argument("--deadline-s", type=float, default=480.0, help="skip engines that would not fit")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="the decode kernels' launch settings, then stop")
    parser.add_argument("--cpu-tiny", action="store_true")
    parser.add_argument("--baseline-rev", default=None)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shapes", default=None, help="BATCHxPROMPTxNEW,... in place of the two RL shapes")
    args = parser.parse_args()
    result = cpu_tiny(args) if args.cpu_tiny else gpu(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'shape':16s} {'engine':20s} {'tokens/s':>10s} {'of floor':>9s} {'seconds':>8s}  note")
    for row in result["runs"]:
        tps = row.get("tokens_per_s", row.get("best_tokens_per_s"))
        frac = row.get("fraction_of_floor")
        seconds = f"{row['seconds']:8.2f}" if "seconds" in row else " " * 8
        print(f"{row.get('shape', 'cpu-tiny'):16s} {row['engine']:20s} {tps or 0:10,.0f} "
              f"{'' if frac is None else f'{frac:9.1%}':9s} {seconds}  {row.get('status', '')}")


if __name__ == "__main__":
    main()
