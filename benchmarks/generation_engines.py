"""The engines that benchmarks/generation.py times, and what it measures them against: the Qwen3-1.7B-shaped model
with random weights, the device's copy bandwidth and the memory floor it sets, the native engine, HF `generate`
(eager and compiled) and forge-exp's vLLM backend, each after a warm-up, with the behaviour logprobs checked against
an HF forward."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402

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
