"""With LoRA, is a generator faster with the adapter merged into its weights, or with it as a low-rank side path?
Measured on CPU, one thread, in one call (docs/models_and_data.md, LoRA, has the table):

    python benchmarks/lora_generation.py --out benchmarks/results/lora_generation_cpu.json

The same eager generation loop (`models.generate.generate`) runs the same weights two ways: peft's LoRA layers
unmerged (each adapted projection computes x W0ᵀ + (x Aᵀ) Bᵀ · alpha/r, the low-rank path) and merged
(merge_and_unload: x Wᵀ); and the native engine (generators/native.py) runs the merged weights, which is what
`generator=torch` does with LoRA. `push_ms`: one push of the adapters into the native engine (AdapterMerge: the
base plus B @ A for every adapted weight, then the copy in). Shapes: the default experiment's generation (the tiny
model, 256 rows x 8 new tokens) and a larger CPU model (hidden 512, 4 layers, 32 rows x 64 new tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402
from forge_exp.models.generate import generate  # noqa: E402
from forge_exp.models.lora import Lora, adapter_parameters, attach  # noqa: E402
from forge_exp.models.tiny import TinyQwen3  # noqa: E402

SHAPES = {  # name: (model sizes, rows, prompt tokens, new tokens)
    "tiny default": ({}, 256, 6, 8),
    "hidden 512 x 4 layers": (dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=64,
                                   intermediate_size=1536, max_position_embeddings=256), 32, 32, 64),
}


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(sizes: dict, rows: int, prompt: int, new: int, rank: int, repeats: int) -> dict:
    lora = {"rank": rank, "alpha": 32.0, "dropout": 0.0, "target_modules": None, "layers": None}
    spec = TinyQwen3(**sizes, lora=lora)
    wrapped = attach(spec.base().build(), Lora.of(lora))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if ".lora_B." in name:  # a trained adapter's B is not zero
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    wrapped.eval()
    adapters = {n: p.detach().clone() for n, p in adapter_parameters(wrapped).items()}
    merged = copy.deepcopy(wrapped).merge_and_unload().eval()
    prompts = [torch.randint(3, 15, (prompt,), generator=gen).tolist() for _ in range(rows)]
    eos = -1  # off: every row makes `new` tokens

    def eager(model):
        return lambda: generate(model, prompts, max_new_tokens=new, temperature=1.0, eos_id=eos, pad_id=0, seed=1)

    tokens = rows * new
    out = {"rows": rows, "new_tokens": new, "rank": rank,
           "eager_lowrank_tok_s": tokens / timed(eager(wrapped), repeats),
           "eager_merged_tok_s": tokens / timed(eager(merged), repeats)}
    with NativeEngine(spec, slots=rows, max_len=prompt + new, eos_token_ids=[eos]) as engine:
        engine.load_weights(adapters.items())
        sampling = Sampling(1, 1.0, 1.0, new, 1)
        out["native_merged_tok_s"] = tokens / timed(lambda: asyncio.run(engine.generate(prompts, sampling)), repeats)
        out["push_ms"] = 1e3 * timed(lambda: engine.load_weights(adapters.items()), repeats)
        out["adapter_bytes"] = sum(t.numel() * t.element_size() for t in adapters.values())
        out["model_bytes"] = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    out["lowrank_slowdown"] = out["eager_merged_tok_s"] / out["eager_lowrank_tok_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__, "runs": {}}
    for name in args.shapes:
        sizes, rows, prompt, new = SHAPES[name]
        for rank in (8, 32):
            r = measure(sizes, rows, prompt, new, rank, args.repeats)
            results["runs"][f"{name}, rank {rank}"] = r
            print(f"{name:>22}, rank {rank:>2}: low-rank {r['eager_lowrank_tok_s']:8.0f} tok/s, merged "
                  f"{r['eager_merged_tok_s']:8.0f} tok/s (eager; low-rank {r['lowrank_slowdown']:.2f}x slower), "
                  f"native merged {r['native_merged_tok_s']:8.0f} tok/s, push {r['push_ms']:.2f} ms", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
