"""The native engine alone at a GRPO wave's decode (gpu.md): 64 rows, as the step makes them at max_policy_age=1 (two
calls of 4 prompts x 8 samples, or one of 8 x 8), prompts of 256 random tokens, 512 new tokens each (no EOS), the
Qwen3-1.7B shape with random weights in bf16. Each case is a fresh engine, one warm-up call (CUDA graph capture),
then one timed call; `max_len` is the KV cache's length, what the run derives from dataset.max_prompt_tokens +
max_new_tokens (1024 at gpu.md's shape) or generation.py's prompt + new (768).

    python3 benchmarks/gpu/decode_wave.py out.json                             # the forge_exp on PYTHONPATH
    PYTHONPATH=/tmp/base python3 benchmarks/gpu/decode_wave.py base.json     # another commit's tree, A/B
"""

import asyncio
import json
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # for benchmarks/; forge_exp as PYTHONPATH has it first
import forge_exp  # noqa: E402
from benchmarks.generation_engines import qwen3_1_7b  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402

# (name, max_len, calls the 8 prompts are split into, generator.gather_ms or None for the default)
CASES = [("768_two", 768, 2, None), ("1024_two", 1024, 2, None), ("1024_two_nogather", 1024, 2, 0),
         ("1024_one", 1024, 1, None), ("768_two_again", 768, 2, None)]


def run_case(model, prompts: list[list[int]], max_len: int, calls: int, gather_ms: float | None) -> dict:
    knobs = {} if gather_ms is None else {"gather_ms": gather_ms}
    engine = NativeEngine.from_model(model, None, seed=0, slots=len(prompts) * 8, max_len=max_len, eos_token_ids=[],
                                     **knobs)
    step = len(prompts) // calls
    parts = [prompts[i : i + step] for i in range(0, len(prompts), step)]

    async def wave(new: int, seed: int):
        return await asyncio.gather(*(engine.generate(p, Sampling(8, max_new_tokens=new, seed=seed + i))
                                      for i, p in enumerate(parts)))

    try:
        asyncio.run(wave(17, 1))
        before = dict(engine.stats)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        results = asyncio.run(wave(512, 2))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
        torch.cuda.empty_cache()
    tokens = sum(len(g.token_ids) for result in results for groups in result for g in groups)
    return {"seconds": seconds, "tokens": tokens, "stats": {k: engine.stats[k] - before[k] for k in engine.stats}}


def main() -> None:
    out = Path(sys.argv[1])
    print("forge_exp from", forge_exp.__file__, flush=True)
    model = qwen3_1_7b("cuda")
    prompts = torch.randint(3, 151936, (8, 256), generator=torch.Generator().manual_seed(64)).tolist()
    rows = []
    for name, max_len, calls, gather_ms in CASES:
        rows.append({"name": name, **run_case(model, prompts, max_len, calls, gather_ms)})
        print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "forge_exp": forge_exp.__file__,
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
