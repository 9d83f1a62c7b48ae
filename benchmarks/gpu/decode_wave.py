"""Probe: the native engine alone at the GRPO step's wave (64 rows = 2 calls of 4 prompts x 8, 256 -> 512), under
the run's max_len (1024) and generation.py's (768), one call or two at once, gather on or off."""
import asyncio
import json
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # benchmarks/; forge_exp as PYTHONPATH has it
from benchmarks.generation_engines import qwen3_1_7b  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402

model = qwen3_1_7b("cuda")
g = torch.Generator().manual_seed(64)
prompts = torch.randint(3, 151936, (8, 256), generator=g).tolist()
out = []
import forge_exp  # noqa: E402

print("forge_exp from", forge_exp.__file__, flush=True)
for name, max_len, calls, gather, eos in [("768_two", 768, 2, None, []), ("1024_two", 1024, 2, None, []),
                                          ("1024_two_nogather", 1024, 2, 0, []), ("1024_one", 1024, 1, None, []),
                                          ("768_two_again", 768, 2, None, [])]:
    knobs = {} if gather is None else {"gather_ms": gather}
    e = NativeEngine.from_model(model, None, seed=0, slots=64, max_len=max_len, eos_token_ids=eos, **knobs)
    parts = [prompts[:8]] if calls == 1 else [prompts[:4], prompts[4:]]

    async def go(new, seed):
        return await asyncio.gather(*(e.generate(p, Sampling(8, max_new_tokens=new, seed=seed + i))
                                      for i, p in enumerate(parts)))

    try:
        asyncio.run(go(17, 1))
        before = dict(e.stats)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = asyncio.run(go(512, 2))
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        tokens = sum(len(x.token_ids) for r in res for gs in r for x in gs)
        row = {"name": name, "seconds": s, "tokens": tokens,
               "stats": {k: e.stats[k] - before[k] for k in e.stats}}
    finally:
        e.close()
        torch.cuda.empty_cache()
    out.append(row)
    print(json.dumps(row), flush=True)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
