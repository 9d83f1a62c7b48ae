"""Generation beside a trainer-like load on one GPU: does splitting the SMs between them (CUDA green contexts) beat
letting them share every SM?

    python benchmarks/colocate.py --out /tmp/colocate.json --commit <sha>      # on one GPU (~2 min)

The native engine generates 32 prompts x 256 tokens -> 512 new tokens (the gpu.md batch, random Qwen3-1.7B-shape
weights as in generation.py) while another thread runs bf16 GEMMs of a training step's size ([24576, 2048] x
[2048, 6144], about what the trainer's forward and backward at this batch are made of) for a fixed count. Each row
times both, started together: alone, together on every SM (the engine on its high-priority stream, as in a run),
and together with the SMs split (the engine's decode and the GEMMs each on a stream of a green context of its own;
a context made current without its streams constrains nothing). The question a row answers: how long until both
are done (wall), against the two run one after the other. Needs CUDA and torch.cuda.green_contexts (torch >= 2.10).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.generation_engines import qwen3_1_7b  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402

BATCH, PROMPT, NEW = 32, 256, 512


def green(sms: int | None):
    """A green context of `sms` SMs (None: the whole device, no context)."""
    if sms is None:
        return None
    from torch.cuda.green_contexts import GreenContext

    return GreenContext.create(num_sms=sms, device_id=0)


class Load:
    """`count` GEMMs on a thread of its own (in `ctx` when given), timed from the start event."""

    def __init__(self, count: int):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(24576, 2048, generator=g, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(2048, 6144, generator=g, device="cuda", dtype=torch.bfloat16)
        self.count, self.seconds = count, None

    def run(self, ctx, start: threading.Event):
        stream = ctx.Stream() if ctx is not None else torch.cuda.Stream()
        with torch.cuda.stream(stream):
            self.a @ self.b  # warm-up (cuBLAS picks its kernel for this context)
            stream.synchronize()
            start.wait()
            t0 = time.perf_counter()
            for _ in range(self.count):
                self.a @ self.b
            stream.synchronize()
            self.seconds = time.perf_counter() - t0


def engine_in(model, ctx) -> NativeEngine:
    """The engine over `model`, decoding on a stream of `ctx` (its graphs are captured on that stream)."""
    cls = NativeEngine
    if ctx is not None:
        class InContext(NativeEngine):
            def _stream(self):
                return ctx.Stream()  # (no priority: the context's SMs are the engine's alone)

        cls = InContext
    return cls.from_model(model, None, seed=0, slots=BATCH, max_len=PROMPT + NEW, eos_token_ids=[])


def row(model, prompts, load: Load | None, gen_sms, load_sms, label) -> dict:
    engine = engine_in(model, green(gen_sms))
    try:
        asyncio.run(engine.generate(prompts, Sampling(max_new_tokens=17, seed=1)))  # graphs captured
        start = threading.Event()
        thread = None
        if load is not None:
            thread = threading.Thread(target=load.run, args=(green(load_sms), start))
            thread.start()
            time.sleep(2.0)  # its warm-up done
        t0 = time.perf_counter()
        start.set()
        asyncio.run(engine.generate(prompts, Sampling(max_new_tokens=NEW, seed=2)))
        gen = time.perf_counter() - t0
        if thread is not None:
            thread.join()
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    out = {"row": label, "generation_sms": gen_sms, "load_sms": load_sms, "generation_seconds": gen,
           "load_seconds": load.seconds if load else None, "wall_seconds": wall}
    print(json.dumps(out), flush=True)
    return out


def load_alone(load: Load, sms) -> dict:
    start = threading.Event()
    start.set()
    thread = threading.Thread(target=load.run, args=(green(sms), start))
    thread.start()
    thread.join()
    out = {"row": "load alone", "load_sms": sms, "load_seconds": load.seconds}
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--gemms", type=int, default=600)
    parser.add_argument("--splits", default="32,48,66")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    model = qwen3_1_7b("cuda")
    g = torch.Generator().manual_seed(BATCH)
    prompts = torch.randint(3, 151936, (BATCH, PROMPT), generator=g).tolist()
    load = Load(args.gemms)
    rows = [row(model, prompts, None, None, None, "generation alone"), load_alone(load, None),
            row(model, prompts, load, None, None, "together, every SM")]
    for n in (int(s) for s in args.splits.split(",")):
        rows.append(row(model, prompts, None, n, None, f"generation alone on {n} SMs"))
        rows.append(load_alone(load, sms - n))
        rows.append(row(model, prompts, load, n, sms - n, f"together, {n} SMs for generation"))
    result = {"commit": args.commit, "machine": torch.cuda.get_device_name(), "sms": sms, "torch": torch.__version__,
              "gemm": "[24576, 2048] x [2048, 6144] bf16", "gemms": args.gemms, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
