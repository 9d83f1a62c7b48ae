"""The GRPO trainer step on one GPU: today's transformers trainer against the TorchTitan engine, in one call.

    python benchmarks/trainer_gpu.py --out results.json          # on the lent H200 (benchmarks/trainer.md)

Stages, each guarded (an error or out-of-memory is recorded and the next stage runs), biggest question first:
  1. bf16 matmul rate: 8192^3 on random data, median of 20 after warm-up (the MFU denominator)
  2. titan, Qwen3-1.7B shape: TorchTitan engine (trainers/titan.py): FSDP2 degree 1, float32 master / bf16 compute,
     per-block torch.compile, SDPA (causal), fused AdamW, chunked vocab-parallel logprobs (no [B, R, V] logits)
  3. hf, Qwen3-1.7B shape: today's trainer, trainers/update.py policy_update on a transformers Qwen3ForCausalLM
     (float32 weights, bf16 autocast, SDPA, AdamW as actors/policy.py builds it), grad_accum 4 as in gpu.md
  4. titan, Qwen3-8B shape: FSDP degree 1 + full activation checkpointing (+ compile) on one GPU: does it fit, at
     what MFU
  5. titan eager (no compile), Qwen3-1.7B, when time is left
  6. on request: flex attention, then sharing (`titan_1.7b_flex`, `titan_1.7b_share`), and the frozen reference
     model's pass alone (`ref_1.7b`, `ref_1.7b_share`: TitanTrainer.score, as trainer.hosts_reference runs it)
Every step: a GRPO loss (beta 0.04: reference logprobs in the batch) on a batch of 32 sequences x (256 prompt + 512
response) tokens of random ids, random weights. Step time: host clock around train_step with a device sync on both
sides, median of the timed steps after warm-up (compile happens in warm-up).
MFU = 6 * N * tokens / step seconds / measured bf16 matmul rate, N = all parameters (embeddings included, tied ones
once), tokens = 32 * 768 per step. It counts neither attention FLOPs nor the activation-checkpointing recompute.

`--profile` adds one more step (or pass) of each titan and reference stage under torch.profiler: the ops that held
the device longest (self time), so that a stage slower than its FLOPs says where.
Needs only the pure modules and torch; it starts its own one-process torch.distributed world (nccl).
`--smoke` runs every stage at a tiny shape on CPU (gloo), to check the script before spending device time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA initialises

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN3 = {  # HF config.json fields (literal sizes, as the Qwen3 releases ship them)
    "1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
}
BATCH, PROMPT, RESPONSE = 32, 256, 512
DEVICE = torch.device("cuda")
SMOKE = False


def hf_config(size: str) -> dict:
    return dict(model_type="qwen3", vocab_size=151936, head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=40960,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, hidden_act="silu",
                attention_bias=False, **QWEN3[size])


def _smoke() -> None:
    """Tiny shapes on CPU: the same code paths, seconds instead of minutes."""
    global BATCH, PROMPT, RESPONSE, DEVICE, SMOKE
    BATCH, PROMPT, RESPONSE, DEVICE, SMOKE = 4, 8, 8, torch.device("cpu"), True
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)
    QWEN3["1.7B"] = dict(tiny, tie_word_embeddings=True)
    QWEN3["8B"] = dict(tiny, tie_word_embeddings=False)


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _memory() -> dict:
    if DEVICE.type != "cuda":
        return {"peak_memory_gib": 0.0, "reserved_memory_gib": 0.0}
    return {"peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reserved_memory_gib": torch.cuda.max_memory_reserved() / 2**30}


def make_batch(vocab: int, seed: int = 0, group: int = 1):
    """BATCH random rows; `group` consecutive rows share a prompt (GRPO's samples of one prompt)."""
    from forge_exp.rl.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ones = lambda *s: torch.ones(*s, dtype=torch.bool)  # noqa: E731
    prompts = torch.randint(3, vocab, (BATCH // group, PROMPT), generator=g).repeat_interleave(group, 0)
    return TrainBatch(
        prompt_ids=prompts, prompt_mask=ones(BATCH, PROMPT),
        response_ids=torch.randint(3, vocab, (BATCH, RESPONSE), generator=g), response_mask=ones(BATCH, RESPONSE),
        behavior_logprobs=-12.0 + 0.1 * torch.randn(BATCH, RESPONSE, generator=g),
        advantages=torch.randn(BATCH, generator=g), truncated=torch.zeros(BATCH, dtype=torch.bool),
        policy_versions=torch.zeros(BATCH, dtype=torch.long),
        ref_logprobs=-12.0 + 0.1 * torch.randn(BATCH, RESPONSE, generator=g),
    )


def matmul_rate(n: int = 8192) -> float:
    if DEVICE.type != "cuda":
        return 1e12  # smoke: a placeholder rate
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b, out=c)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n**3 / statistics.median(times)


def timed_steps(step, warmup: int, steps: int) -> tuple[list[float], dict]:
    times, metrics = [], {}
    for i in range(warmup + steps):
        _sync()
        t0 = time.perf_counter()
        metrics = step()
        _sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        print(f"  step {i}: {time.perf_counter() - t0:.3f} s loss {metrics.get('loss/total', float('nan')):.4f}",
              flush=True)
    return times, metrics


def profiled(fn, top: int = 15) -> list[dict]:
    """One call of fn under torch.profiler: the `top` ops by self device time (CPU time on the smoke run)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = DEVICE.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        _sync()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    return [{"op": e.key[:120], "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 3)} for e in rows]


def summarise(times: list[float], n_params: int, rate: float, metrics: dict, passes: int = 3) -> dict:
    """`passes`: 3 for a training step (forward and backward: 6 N FLOPs a token), 1 for a forward (2 N)."""
    sec = statistics.median(times)
    tokens = BATCH * (PROMPT + RESPONSE)
    flops = 2 * passes * n_params * tokens
    return {
        "step_seconds_median": sec, "step_seconds": times, "tokens_per_s": tokens / sec,
        "mfu": flops / sec / rate, "achieved_tflops": flops / sec / 1e12,
        "params": n_params, **_memory(),
        "loss": metrics.get("loss/total"), "grad_norm": metrics.get("train/grad_norm"),
    }


def titan_stage(size: str, rate: float, *, compile: bool, chunk_rows: int, warmup: int, steps: int, ac: str = "none",
                grad_accum: int = 1, attention: str = "sdpa", share_prompts: bool = False, profile: bool = False,
                reference: bool = False) -> dict:
    """The TorchTitan engine's training step; with `reference`, the frozen reference model's pass over the batch
    instead (TitanTrainer.score: one forward of the whole batch, weights in bf16, no gradient), as the trainer hosts
    it (trainer.hosts_reference), its MFU at 2 N FLOPs a row token."""
    from forge_exp.rl.losses import GRPOLoss
    from forge_exp.trainers.parallel import Degrees
    from forge_exp.trainers.titan import TitanTrainer

    cfg = hf_config(size)
    role = dict(loss=None, lr=0.0, frozen=True) if reference else dict(loss=GRPOLoss(beta=0.04), lr=1e-6,
                                                                         activation_checkpointing=ac)
    t0 = time.perf_counter()
    trainer = TitanTrainer(cfg, degrees=Degrees(1, 1, 1), compile=compile, chunk_rows=chunk_rows, attention=attention,
                           share_prompts=share_prompts, **role)
    build = time.perf_counter() - t0
    n_params = sum(p.numel() for p in trainer.model.parameters())
    batch = make_batch(cfg["vocab_size"], group=min(8, BATCH) if share_prompts else 1)

    def call() -> dict:
        if reference:
            return {"loss/total": float(trainer.score(batch, 1.0).mean())}
        return trainer.train_step(batch, grad_accum=grad_accum, max_grad_norm=1.0, temperature=1.0)

    try:
        times, metrics = timed_steps(call, warmup, steps)
        out = summarise(times, n_params, rate, metrics, passes=1 if reference else 3)
        if profile:
            out["profile"] = profiled(call)
    finally:
        del trainer
    shape = {"reference": True} if reference else {"activation_checkpointing": ac, "grad_accum": grad_accum}
    return {**out, "build_seconds": build, "compile": compile, **shape, "chunk_rows": chunk_rows,
            "warmup_steps": warmup, "attention": attention, "share_prompts": share_prompts}


def hf_stage(size: str, rate: float, *, grad_accum: int, warmup: int, steps: int) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from forge_exp.rl.losses import GRPOLoss
    from forge_exp.trainers.update import Policy, policy_update

    cfg = dict(hf_config(size))
    cfg.pop("model_type")
    with DEVICE:
        model = Qwen3ForCausalLM(Qwen3Config(**cfg, attn_implementation="sdpa"))  # float32 master weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, betas=(0.9, 0.99))  # as actors/policy.py
    policy = Policy(DEVICE, model, None, opt, GRPOLoss(beta=0.04), torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    batch = make_batch(cfg["vocab_size"])
    try:
        times, metrics = timed_steps(
            lambda: policy_update(policy, batch, grad_accum=grad_accum, max_grad_norm=1.0, temperature=1.0),
            warmup, steps,
        )
        out = summarise(times, n_params, rate, metrics)
    finally:
        del model, opt, policy
    return {**out, "grad_accum": grad_accum, "warmup_steps": warmup}


def guarded(name: str, results: dict, out: Path, fn, *args, **kwargs) -> None:
    print(f"== {name}", flush=True)
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        results[name] = {"ok": True, **fn(*args, **kwargs)}
    except torch.cuda.OutOfMemoryError as e:
        results[name] = {"ok": False, "fits": False, "error": f"out of memory: {str(e).splitlines()[0]}",
                         **_memory()}
    except Exception as e:  # keep going: later stages answer other questions
        results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    results[name]["stage_seconds"] = time.perf_counter() - t0
    print(json.dumps({k: v for k, v in results[name].items() if k not in ("traceback", "step_seconds")}), flush=True)
    if not results[name]["ok"]:
        print(results[name].get("traceback", ""), flush=True)
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    out.write_text(json.dumps(results, indent=2))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=400.0, help="skip optional stages past this many seconds")
    p.add_argument("--stages", default="titan_1.7b,hf_1.7b,titan_8b,titan_1.7b_eager")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU")
    p.add_argument("--grad-accum", type=int, default=None,
                   help="the 1.7B titan stages' grad_accum instead of 1 (2 fits an 80 GB card: 1 holds ~80 GiB)")
    p.add_argument("--profile", action="store_true", help="one more step of each titan and reference stage, profiled")
    args = p.parse_args()
    if args.smoke:
        _smoke()
    start = time.perf_counter()
    rdv = tempfile.mktemp(prefix="trainer_gpu_rdv_")
    if DEVICE.type == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"file://{rdv}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=0, world_size=1)
    results: dict = {
        "device": torch.cuda.get_device_name(0) if DEVICE.type == "cuda" else "cpu (smoke)", "torch": torch.__version__,
        "batch": {"sequences": BATCH, "prompt_tokens": PROMPT, "response_tokens": RESPONSE},
        "mfu_definition": "6 * params * (32*768 tokens) / step seconds / measured bf16 matmul rate (with "
                          "share_prompts the rows' tokens too, though the model runs fewer: an effective MFU)",
    }
    try:
        import torchtitan
        import transformers

        results["torchtitan"], results["transformers"] = getattr(torchtitan, "__version__", "0.3.0"), transformers.__version__
    except Exception as e:
        results["import_error"] = repr(e)
    rate = matmul_rate()
    results["bf16_matmul_tflops"] = rate / 1e12
    print(f"bf16 matmul: {rate / 1e12:.1f} TFLOP/s", flush=True)
    stages = {
        "titan_1.7b": (titan_stage, ("1.7B", rate), dict(compile=not SMOKE, ac="none", grad_accum=1, chunk_rows=8192,
                                                         warmup=3, steps=5)),
        "hf_1.7b": (hf_stage, ("1.7B", rate), dict(grad_accum=4, warmup=2, steps=4)),
        "titan_8b": (titan_stage, ("8B", rate), dict(compile=not SMOKE, ac="full", grad_accum=4, chunk_rows=2048,
                                                     warmup=2, steps=3)),
        "titan_1.7b_eager": (titan_stage, ("1.7B", rate), dict(compile=False, ac="none", grad_accum=1,
                                                               chunk_rows=8192, warmup=2, steps=4)),
        # flex attention (no backward on CPU: the smoke run takes SDPA), then 8 rows a prompt run once
        "titan_1.7b_flex": (titan_stage, ("1.7B", rate), dict(compile=not SMOKE, ac="none", grad_accum=1,
                                                              chunk_rows=8192, warmup=3, steps=5,
                                                              attention="sdpa" if SMOKE else "flex")),
        "titan_1.7b_share": (titan_stage, ("1.7B", rate), dict(compile=not SMOKE, ac="none", grad_accum=1,
                                                               chunk_rows=8192, warmup=3, steps=5, share_prompts=True,
                                                               attention="sdpa" if SMOKE else "flex")),
        "ref_1.7b": (titan_stage, ("1.7B", rate), dict(compile=not SMOKE, chunk_rows=8192, warmup=3, steps=5,
                                                       reference=True)),
        "ref_1.7b_share": (titan_stage, ("1.7B", rate), dict(compile=not SMOKE, chunk_rows=8192, warmup=3, steps=5,
                                                             reference=True, share_prompts=True,
                                                             attention="sdpa" if SMOKE else "flex")),
    }
    for name, (fn, a, kw) in stages.items():
        if fn is titan_stage:
            kw["profile"] = args.profile
            if args.grad_accum is not None and a[0] == "1.7B" and not kw.get("reference"):
                kw["grad_accum"] = args.grad_accum
    for name in args.stages.split(","):
        if time.perf_counter() - start > args.budget_s:
            results[name] = {"ok": False, "error": f"skipped: past the {args.budget_s:.0f} s budget"}
            continue
        fn, a, kw = stages[name]
        guarded(name, results, args.out, fn, *a, **kw)
    results["total_seconds"] = time.perf_counter() - start
    args.out.write_text(json.dumps(results, indent=2))
    dist.destroy_process_group()
    print(f"\n{'stage':<18} {'ok':<4} {'step s':>8} {'tok/s':>9} {'MFU':>7} {'peak GiB':>9}")
    for name in args.stages.split(","):
        r = results.get(name, {})
        if r.get("ok"):
            print(f"{name:<18} {'yes':<4} {r['step_seconds_median']:8.3f} {r['tokens_per_s']:9.0f} "
                  f"{100 * r['mfu']:6.1f}% {r['peak_memory_gib']:9.1f}")
        else:
            print(f"{name:<18} {'no':<4} {r.get('error', '')[:90]}")
    print(f"bf16 matmul {rate / 1e12:.1f} TFLOP/s; total {results['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
