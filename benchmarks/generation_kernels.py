"""The native engine's kernels for benchmarks/generation.py: the Triton kernels checked against the torch ops and the
engine against the eager path (`checks`), a profiled engine call (`profile_native`), and the decode kernels' launch
settings swept at one shape (`sweep`, timed as CUDA graphs)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.generation_engines import run_native, timed  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402
from forge_exp.models.generate import generate  # noqa: E402

def checks(device: str) -> dict:
    """Triton kernels vs the torch ops (relative error), then the engine vs the eager path, float32, on the GPU."""
    from forge_exp.generators import ops, triton_ops
    from forge_exp.models.tiny import qwen3

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))

    out = {}
    g = torch.Generator(device=device).manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        r = lambda *s: torch.randn(*s, generator=g, device=device).to(dtype)  # noqa: E731
        n, hq, hkv, d, slots, length = 37, 16, 8, 128, 9, 700
        x, res, w = r(n, 2048), r(n, 2048), r(2048)
        y = [mod.add_rms_norm(x, res, w, 1e-6) for mod in (ops, triton_ops)]
        qkv, qkn, cos, sin = r(n, (hq + 2 * hkv) * d), r(2 * d), r(n, d), r(n, d)
        pos = torch.randperm(length, generator=g, device=device)[:n]  # distinct (slot, position) writes
        slot = torch.randint(0, slots + 1, (n,), generator=g, device=device)
        caches = [[r(slots + 1, hkv, length, d) for _ in range(2)] for _ in range(2)]
        caches[1] = [c.clone() for c in caches[0]]
        q = [mod.qk_rope_store(qkv, qkn, 1e-6, cos, sin, pos, slot, *c, hq)
             for mod, c in zip((ops, triton_ops), caches)]
        written = [[c[slot, :, pos] for c in pair] for pair in caches]  # [n, Hkv, D] each
        lens = torch.randint(1, length + 1, (n,), generator=g, device=device)
        a = [mod.attention(q[0], *caches[0], slot, lens, None, d**-0.5) for mod in (ops, triton_ops)]
        gu = r(n, 2 * 6144)
        s = [mod.silu_mul(gu) for mod in (ops, triton_ops)]
        logits, keys = r(n, 151936) * 3, torch.arange(n, device=device) * 7919
        temp = torch.rand(n, generator=g, device=device).masked_fill(torch.arange(n, device=device) % 5 == 0, 0.0)
        drawn = [mod.sample(logits, temp, torch.ones(n, device=device), keys, torch.full((n,), 3, device=device),
                            False) for mod in (ops, triton_ops)]
        out[str(dtype)] = {"add_rms_norm": rel(y[1][0], y[0][0]), "residual": rel(y[1][1], y[0][1]),
                           "qk_rope": rel(q[1], q[0]), "k_cache": rel(written[1][0], written[0][0]),
                           "v_cache": rel(written[1][1], written[0][1]), "attention": rel(a[1], a[0]),
                           "silu_mul": rel(s[1], s[0]),
                           "sample_tokens_differing": int((drawn[1][0] != drawn[0][0]).sum()),
                           "sample_logprob_max_diff": float((drawn[1][1] - drawn[0][1]).abs().max())}
    model = qwen3(vocab_size=512, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32,
                  intermediate_size=512, max_position_embeddings=256, pad_id=0, bos_id=1, eos_id=2, seed=0)
    with torch.no_grad():  # large weights: peaked next-token distributions, so float noise cannot flip a draw
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(p.numel()))
    model = model.to(device).eval()
    rows = [[1] + torch.randint(3, 512, (int(k),), generator=g, device=device).tolist()
            for k in torch.randint(3, 40, (12,), generator=g, device=device)]
    mismatched, worst = 0, 0.0
    engine = NativeEngine.from_model(model, None, seed=0, slots=4, max_len=128, eos_token_ids=[2], sync_every=4)
    try:
        for sampling in (Sampling(n=2, max_new_tokens=30, seed=3), Sampling(n=1, top_p=0.9, max_new_tokens=20, seed=4),
                         Sampling(n=1, temperature=0.0, max_new_tokens=25)):
            got = asyncio.run(engine.generate(rows, sampling))
            want = generate(model, [p for p in rows for _ in range(sampling.n)], max_new_tokens=sampling.max_new_tokens,
                            temperature=sampling.temperature, top_p=sampling.top_p, eos_id=2, pad_id=0,
                            seed=sampling.seed if sampling.seed is not None else 0)
            for gen, ref in zip([x for gs in got for x in gs], want):
                if gen.token_ids != ref.token_ids:
                    mismatched += 1
                else:
                    worst = max([worst] + [abs(a - b) for a, b in zip(gen.logprobs, ref.logprobs)])
        out["engine_vs_eager_fp32"] = {"rows": 12 * 4, "mismatched_rows": mismatched, "max_logprob_diff": worst,
                                       "stats": dict(engine.stats)}
    finally:
        engine.close()
    return out


def profile_native(model, prompts, new: int, top: int = 15) -> dict:
    """Where a native-engine call's time goes: torch.profiler over one call (after a warm-up), the CUDA kernels by
    total device time, and the device-busy share of the wall time (low: the host is what the decode waits on)."""
    from torch.profiler import ProfilerActivity, profile

    engine = NativeEngine.from_model(model, None, seed=0, slots=len(prompts), max_len=len(prompts[0]) + new,
                                     eos_token_ids=[])
    try:
        asyncio.run(engine.generate(prompts, Sampling(max_new_tokens=17, seed=1)))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _, seconds = timed(lambda: asyncio.run(engine.generate(prompts, Sampling(max_new_tokens=new, seed=2))))
    finally:
        engine.close()
        torch.cuda.empty_cache()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return {"profiled_seconds": seconds, "profiled_tokens": len(prompts) * new, "device_busy_seconds": busy,
            "device_busy_fraction": busy / seconds,
            "top_kernels": [{"name": e.key[:120], "ms": round(e.self_device_time_total / 1e3, 2), "calls": e.count}
                            for e in kernels[:top]]}


def _device_ms(fn, reps: int = 30) -> float:
    """Device milliseconds per call of `fn`, replayed as one CUDA graph of `reps` calls (as the engine runs its
    decode step): a kernel shorter than its launch would otherwise be timed at the host's launch rate."""
    fn()  # compiles, and cuBLAS picks its kernels
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (3 * reps)


ATTENTION_KNOBS = ("SPLIT", "BLOCK_N", "ATTN_WARPS", "ATTN_STAGES")
# (split, block, warps, stages): the chunk loop's launch settings the sweep times
ATTENTION_SETTINGS = [(split, block, warps, stages) for split in (64, 128, 256) for block in (32, 64)
                      for warps in (4,) for stages in (2, 3)]
SAMPLE_KNOBS = ("SAMPLE_BLOCK", "SAMPLE_WARPS")


def sweep(model, bandwidth: float, batch: int, prompt: int, new: int) -> dict:
    """The decode kernels' launch settings at one shape: one layer's split-KV attention over caches of the engine's
    length (prompt + new) whose rows sit at random live lengths in [prompt, prompt + new] (bytes: each row's live K
    and V once), and the sampler (torch ops against the fused kernel) over [batch, vocab] logits; then the engine
    end to end with the default and the fastest settings."""
    from forge_exp.generators import ops, triton_ops
    from forge_exp.models.sampling import row_key

    dev, g = "cuda", torch.Generator(device="cuda").manual_seed(0)
    cfg = model.config
    hq, hkv, d, length = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, prompt + new
    q = torch.randn(batch, hq, d, generator=g, device=dev, dtype=torch.bfloat16)
    kc, vc = (torch.randn(batch + 1, hkv, length, d, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(2))
    slots = torch.arange(batch, device=dev)
    lens = torch.randint(prompt, length + 1, (batch,), generator=g, device=dev)
    live_bytes = int(lens.sum()) * hkv * d * 2 * 2
    default = {k: getattr(triton_ops, k) for k in ATTENTION_KNOBS + SAMPLE_KNOBS}
    want = ops.attention(q, kc, vc, slots, lens, None, d**-0.5)
    rows = []
    for setting in ATTENTION_SETTINGS:
        knobs = dict(zip(ATTENTION_KNOBS, setting))
        for k, v in knobs.items():
            setattr(triton_ops, k, v)
        try:
            got = triton_ops.attention(q, kc, vc, slots, lens, None, d**-0.5)
            err = float((got.float() - want.float()).norm() / want.float().norm())
            ms = _device_ms(lambda: triton_ops.attention(q, kc, vc, slots, lens, None, d**-0.5))
            rows.append({**knobs, "ms": ms, "of_bandwidth": live_bytes / (ms / 1e3) / bandwidth, "rel_err": err})
        except Exception as error:  # a setting the compiler refuses (shared memory) is skipped
            rows.append({**knobs, "status": f"failed: {type(error).__name__}"[:200]})
    for k in ATTENTION_KNOBS:
        setattr(triton_ops, k, default[k])
    attention = sorted([r for r in rows if "ms" in r], key=lambda r: r["ms"])
    vocab = cfg.vocab_size
    logits = (torch.randn(batch, vocab, generator=g, device=dev) * 3).to(torch.bfloat16)
    temp, top_p = torch.ones(batch, device=dev), torch.ones(batch, device=dev)
    keys = torch.tensor([row_key(0, r) for r in range(batch)], device=dev)
    steps = torch.zeros(batch, dtype=torch.long, device=dev)
    ref = ops.sample(logits, temp, top_p, keys, steps, False)
    try:
        torch_ms = _device_ms(lambda: ops.sample(logits, temp, top_p, keys, steps, False))
        samplers = [{"sampler": "torch ops", "ms": torch_ms}]
    except Exception as error:  # not capturable: the fused rows still stand on their own
        samplers = [{"sampler": "torch ops", "status": f"failed: {type(error).__name__}"[:200]}]
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            triton_ops.SAMPLE_BLOCK, triton_ops.SAMPLE_WARPS = block, warps
            tok, lp = triton_ops.sample(logits, temp, top_p, keys, steps, False)
            samplers.append({"sampler": "fused", "SAMPLE_BLOCK": block, "SAMPLE_WARPS": warps,
                             "ms": _device_ms(lambda: triton_ops.sample(logits, temp, top_p, keys, steps, False)),
                             "tokens_differing": int((tok != ref[0]).sum()),
                             "max_logprob_diff": float((lp - ref[1]).abs().max())})
    fused = sorted([r for r in samplers if r["sampler"] == "fused"], key=lambda r: r["ms"])
    g_prompts = torch.Generator().manual_seed(batch)
    prompts = torch.randint(3, vocab, (batch, prompt), generator=g_prompts).tolist()
    engine_runs = []
    fastest_attention = {k: attention[0][k] for k in ATTENTION_KNOBS}
    fastest_sampler = {k: fused[0][k] for k in SAMPLE_KNOBS}
    for label, knobs in (("default", default), ("fastest attention", {**default, **fastest_attention}),
                         ("fastest sampler", {**default, **fastest_sampler}),
                         ("fastest", {**fastest_attention, **fastest_sampler})):
        for k, v in knobs.items():
            setattr(triton_ops, k, v)
        run = run_native(model, prompts, new)
        engine_runs.append({"settings": label, **knobs, **run, "tokens_per_s": run["tokens"] / run["seconds"]})
        print(json.dumps(engine_runs[-1]), flush=True)
    for k, v in default.items():
        setattr(triton_ops, k, v)
    return {"shape": f"{batch}x{prompt}->{new}", "live_kv_bytes_per_layer": live_bytes,
            "attention": attention[:12] + [r for r in rows if "ms" not in r], "attention_configs": len(rows),
            "attention_default": [r for r in attention if all(r[k] == default[k] for k in ATTENTION_KNOBS)],
            "samplers": samplers, "engine": engine_runs}
