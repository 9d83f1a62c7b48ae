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
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402
from forge_exp.models.generate import generate  # noqa: E402

SHAPES = ((32, 256, 512), (256, 128, 256))  # (batch, prompt tokens, new tokens)


def qwen3_1_7b(device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = None  # EOS off: every engine runs every row to max_new_tokens
    model.generation_config.pad_token_id = 0
    return model


def copy_bandwidth(device: str, gib: float = 2.0) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read and written (median of 20)."""
    src = torch.randn(int(gib * 2**30 / 4), device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * 4 / statistics.median(times)


def floor_tokens_per_s(model, batch: int, prompt: int, new: int, bandwidth: float) -> dict:
    """Each of the new-1 decode steps reads every weight once and, per row, the K/V of its prompt + t tokens."""
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # tied embedding counted once
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * model.dtype.itemsize
    seconds = sum(weights + batch * (prompt + t) * kv_per_token for t in range(1, new)) / bandwidth
    return {"weight_bytes": weights, "kv_bytes_per_token": kv_per_token, "tokens_per_s": batch * new / seconds}


def timed(fn):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def run_native(model, prompts, new: int, group: int = 1, **knobs) -> dict:
    """The engine's timed call after a warm-up (CUDA graph capture). `group`: the rows are len(prompts) / group
    prompts sampled `group` times each (as GRPO samples), which share their prompt's prefill."""
    engine = NativeEngine.from_model(model, None, seed=0, slots=len(prompts), max_len=len(prompts[0]) + new,
                                     eos_token_ids=[], **knobs)
    distinct = prompts[: len(prompts) // group]
    try:
        _, setup = timed(lambda: asyncio.run(engine.generate(distinct, Sampling(group, max_new_tokens=17, seed=1))))
        out, seconds = timed(lambda: asyncio.run(engine.generate(distinct, Sampling(group, max_new_tokens=new,
                                                                                    seed=2))))
        result = {"seconds": seconds, "warmup_seconds": setup, "group": group,
                  "tokens": sum(len(g.token_ids) for gs in out for g in gs),
                  "stats": dict(engine.stats), "kernels": engine.runner.decoder.kernels.__name__,
                  "cuda_graphs": engine.runner.cuda_graphs, "sync_every": engine.sync_every,
                  "lookahead": engine.lookahead, "share_prompt_kv": engine.runner.shared}
        result["logprob_check"] = logprob_check(model, prompts[:4], [g[0] for g in out[:4]])
        return result
    finally:
        engine.close()
        torch.cuda.empty_cache()


@torch.no_grad()
def logprob_check(model, prompts, generations, upto: int = 64) -> dict:
    """The engine's behaviour logprobs against an HF forward over prompt + sampled tokens (bf16: ~1e-2 apart)."""
    diffs = []
    for prompt, g in zip(prompts, generations):
        ids = torch.tensor([prompt + g.token_ids[:upto]], device=model.device)
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
        diffs.append((ref - torch.tensor(g.logprobs[:upto], device=ref.device)).abs())
    d = torch.cat(diffs)
    return {"positions": d.numel(), "max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean())}


def run_hf(model, prompts, new: int, compiled: bool) -> dict:
    from transformers import StoppingCriteria, StoppingCriteriaList

    ids = torch.tensor(prompts, device=model.device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
              max_new_tokens=new, pad_token_id=0)
    if compiled:
        from transformers import CompileConfig

        kw.update(cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead"))

    class StopAfter(StoppingCriteria):  # the warm-up runs at the full shape (same static cache) but stops early
        def __call__(self, input_ids, scores, **_):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= ids.shape[1] + 4, device=ids.device)

    _, setup = timed(lambda: model.generate(ids, stopping_criteria=StoppingCriteriaList([StopAfter()]), **kw))
    out, seconds = timed(lambda: model.generate(ids, **kw))
    return {"seconds": seconds, "warmup_seconds": setup, "tokens": (out.shape[1] - ids.shape[1]) * ids.shape[0]}


_VLLM: dict = {}  # one vLLM engine serves both shapes: its start (torch.compile, CUDA graph capture) is paid once


def vllm_engine(model):
    """forge-exp's vLLM backend (generators/vllm.py), the engine `generator=vllm` runs, on `model`'s weights."""
    if not _VLLM:
        import tempfile

        from forge_exp.generators.vllm import VllmEngine
        from forge_exp.models.hf import ModelSpec

        sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
        from make_model import build_tokenizer

        tmp = tempfile.mkdtemp(prefix="generation-vllm-")
        model.save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        t0 = time.perf_counter()
        engine = VllmEngine(ModelSpec(path=tmp, dtype="bfloat16"), "cuda", seed=0, gpu_memory_utilization=0.45,
                            max_model_len=max(p + n for _, p, n in SHAPES), max_num_seqs=max(b for b, _, _ in SHAPES))
        _VLLM.update(engine=engine, dir=tmp, start_seconds=time.perf_counter() - t0)
    return _VLLM["engine"]


def close_vllm() -> None:
    if _VLLM:
        import shutil

        _VLLM.pop("engine").close()
        shutil.rmtree(_VLLM.pop("dir"), ignore_errors=True)


def run_vllm(model, prompts, new: int) -> dict:
    try:
        import vllm
    except ImportError:
        return {"status": "not importable"}
    engine = vllm_engine(model)
    _, setup = timed(lambda: asyncio.run(engine.generate(prompts, Sampling(max_new_tokens=17, seed=1))))
    out, seconds = timed(lambda: asyncio.run(engine.generate(prompts, Sampling(max_new_tokens=new, seed=2))))
    return {"seconds": seconds, "warmup_seconds": setup, "start_seconds": _VLLM["start_seconds"],
            "tokens": sum(len(g[0].token_ids) for g in out), "version": vllm.__version__,
            "features": engine.features._asdict(),
            "logprob_check": logprob_check(model, prompts[:4], [g[0] for g in out[:4]])}


@torch.no_grad()
def vllm_sync(model, prompts, repeats: int = 5) -> dict:
    """Seconds to push the whole model into the vLLM engine (`load_weights` from CUDA tensors: IPC handles, pause,
    reload, reset, resume), and a check that the pushed weights are the ones that then sample: the model's MLPs
    scaled, the engine's logprobs compared before the push (stale weights: far apart) and after (bf16-close)."""
    engine = vllm_engine(model)
    params = [(n, p.detach()) for n, p in model.named_parameters()]
    seconds = sorted(timed(lambda: engine.load_weights(params))[1] for _ in range(repeats))
    for layer in model.model.layers:
        layer.mlp.down_proj.weight.mul_(4.0)

    def check() -> dict:
        out = asyncio.run(engine.generate(prompts[:4], Sampling(max_new_tokens=32, seed=3)))
        return logprob_check(model, prompts[:4], [g[0] for g in out])

    stale = check()
    engine.load_weights(params)
    fresh = check()
    for layer in model.model.layers:
        layer.mlp.down_proj.weight.mul_(0.25)
    engine.load_weights(params)
    return {"engine": "vllm_sync", "seconds_median": seconds[len(seconds) // 2], "seconds_all": seconds,
            "bytes": sum(p.numel() * p.element_size() for _, p in params), "tensors": len(params),
            "before_push": stale, "after_push": fresh}


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
