"""One layout run's numbers, from its MLflow store, its nvidia-smi memory log and the measured ceilings.

    python benchmarks/gpu/summarize.py --layout single_gpu --db RUN/mlflow.db --mem mem.csv --peak peak.json \
        --rows 32 --prompt 256 --out single_gpu.json

Step metrics are the app's own (apps/grpo.py): means over the steps after --warmup (the first steps load kernels,
allocate the caches and fill the replay buffer). Means, not medians: with rollouts beside training the loop runs in
cycles of up to max_policy_age + 1 steps (at age 1 a step that waits long for its batch, then one that finds the
next batch ready), and a median picks one phase; 6 measured steps (8, warmup 2) are whole cycles at ages 0 to 2.
MFU = model FLOPs / seconds / the bf16 matmul rate measured on the same machine in the same call (peak.py), with
FLOPs counted from the Qwen3 shape below (no recomputation counted):
    forward per row   2·N_layers·T + 2·L·T²·H·d_head (causal attention) + 2·d·V·(R+1) (lm_head, response positions)
                      (with --group g, trainer.share_prompts: per g rows one sequence of P + g·R tokens, attention
                      over its prompt's and each response's pairs; the FLOPs run, not the rows')
    training          3 × forward  (train/seconds: logprob forward, backward, clip, AdamW step)
    generation        prefill 2·N·P per row (+ lm_head once); per sampled token 2·N_layers + 2·d·V + 4·L·ctx·H·d_head
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

# Qwen3-1.7B (benchmarks/gpu/make_model.py)
L, D, H, KV, HD, FF, V = 28, 2048, 16, 8, 128, 6144, 151936
N_LAYERS = L * (D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * FF)  # attention + MLP weights
KEYS = (
    "time/step_seconds", "time/wait_seconds", "train/seconds", "train/tokens_per_s", "generator/seconds",
    "generator/tokens", "generator/tokens_per_s", "generator/sync_seconds", "sync/seconds", "train/policy_age",
    "rollout/policy_age", "loss/total", "reward/mean", "train/grad_norm", "sync/bytes", "sync/capture_seconds",
    *(f"timeline/{k}_seconds" for k in ("rollout", "reference", "train", "sync", "score", "overlap", "idle")),
)


def forward_flops(rows: int, prompt: int, response: float, group: int = 1) -> float:
    """`group`: rows a sequence holds (trainer.share_prompts: a prompt once, then its group's responses)."""
    tokens = prompt + group * response
    pairs = prompt * prompt / 2 + group * (response * prompt + response * response / 2)  # (query, key) pairs
    return rows / group * (2 * N_LAYERS * tokens + 4 * L * pairs * H * HD) + rows * 2 * D * V * (response + 1)


def generation_flops(rows: int, prompt: int, response: float) -> float:
    prefill = rows * (2 * N_LAYERS * prompt + 2 * L * prompt * prompt * H * HD + 2 * D * V)
    ctx = prompt + response / 2  # mean context of a decode step
    decode = rows * response * (2 * N_LAYERS + 2 * D * V + 4 * L * ctx * H * HD)
    return prefill + decode


def metric_history(db: str) -> tuple[dict[str, dict[int, float]], str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("forge-exp")
    run = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)[0]
    out = {}
    for key in KEYS:
        out[key] = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
    return out, run.info.run_id


def shape(config: dict) -> None:
    """Take the model's dimensions from its config.json instead of Qwen3-1.7B's (the FLOP counts read them)."""
    global L, D, H, KV, HD, FF, V, N_LAYERS
    L, D, H = config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]
    KV, FF, V = config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]
    HD = config.get("head_dim") or D // H
    N_LAYERS = L * (D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * FF)


def memory(path: Path) -> dict:
    """Peak nvidia-smi memory.used per GPU and per (GPU, pid) from the sampler's two logs."""
    per_gpu: dict[str, float] = defaultdict(float)
    per_proc: dict[str, float] = defaultdict(float)
    if path.exists():
        for row in csv.reader(path.open()):
            if len(row) == 3 and row[0].strip().isdigit():
                per_gpu[f"gpu{row[0].strip()}"] = max(per_gpu[f"gpu{row[0].strip()}"], float(row[2]))
    procs = path.with_suffix(".procs.csv")
    uuid_index = {}
    gpus = path.with_suffix(".gpus.csv")
    if gpus.exists():
        for row in csv.reader(gpus.open()):
            if len(row) >= 2:
                uuid_index[row[1].strip()] = row[0].strip()
    if procs.exists():
        for row in csv.reader(procs.open()):
            if len(row) == 3 and row[0].strip().isdigit():
                key = f"gpu{uuid_index.get(row[1].strip(), row[1].strip())}/pid{row[0].strip()}"
                per_proc[key] = max(per_proc[key], float(row[2]))
    return {"peak_used_mib_per_gpu": dict(per_gpu), "peak_used_mib_per_process": dict(per_proc)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--mem", type=Path, help="nvidia-smi's log (none on CPU: no memory figures)")
    p.add_argument("--peak", type=Path, help="peak.py's measurement (none on CPU: no MFU)")
    p.add_argument("--model-config", type=Path, help="the model's config.json (default: the Qwen3-1.7B shape above)")
    p.add_argument("--lora", action="store_true",
                   help="LoRA: training is 2 forwards' FLOPs (no weight gradients for the frozen base), not 3")
    p.add_argument("--group", type=int, default=1,
                   help="trainer.share_prompts: rows a prompt's sequence holds (its samples); the FLOPs it ran")
    p.add_argument("--rows", type=int, default=32, help="sequences per step (prompts_per_step × group_size)")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--command", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.model_config:
        shape(json.loads(args.model_config.read_text()))

    history, run_id = metric_history(args.db)
    steps = sorted(history["time/step_seconds"])
    kept = [s for s in steps if s > args.warmup]

    def avg(key: str) -> float | None:  # the mean over the measured steps (the docstring says why)
        values = [history[key][s] for s in kept if s in history[key]]
        return statistics.fmean(values) if values else None

    peak = json.loads(args.peak.read_text()) if args.peak else None
    matmul = statistics.median(d["bf16_matmul_tflops"] for d in peak["devices"]) * 1e12 if peak else float("nan")
    response = (avg("generator/tokens") or 0) / args.rows  # mean completion length of a generate call
    train_flops = (2 if args.lora else 3) * forward_flops(args.rows, args.prompt, response, args.group)
    gen_flops = generation_flops(args.rows, args.prompt, response)
    train_s, gen_s = avg("train/seconds"), avg("generator/seconds")
    result = {
        "layout": args.layout,
        "command": args.command,
        "mlflow_run_id": run_id,
        "steps_logged": len(steps),
        "steps_measured": f"{kept[0]}..{kept[-1]}" if kept else "",
        "mean_over_steps": len(kept),
        "rows_per_step": args.rows,
        "prompt_tokens": args.prompt,
        "mean_completion_tokens": response,
        "step_seconds": avg("time/step_seconds"),
        "wait_seconds": avg("time/wait_seconds"),
        "train_seconds": train_s,
        "train_tokens_per_s": avg("train/tokens_per_s"),
        "generate_seconds": gen_s,
        "generation_tokens_per_s": avg("generator/tokens_per_s"),
        "weight_push_seconds": avg("sync/seconds"),
        "weight_capture_seconds": avg("sync/capture_seconds"),  # of the push: the trainer's snapshot (titan)
        "weight_push_bytes": avg("sync/bytes"),
        "generator_load_seconds": avg("generator/sync_seconds"),
        "train_policy_age": avg("train/policy_age"),
        "train_mfu": train_flops / train_s / matmul if train_s else None,
        "generation_mfu": gen_flops / gen_s / matmul if gen_s else None,
        "train_tflops": train_flops / train_s / 1e12 if train_s else None,
        "generation_tflops": gen_flops / gen_s / 1e12 if gen_s else None,
        "bf16_matmul_tflops_measured": matmul / 1e12,
        # where a step's wall time went (runtime/timeline.py: service calls as the controller saw them)
        "timeline_seconds": {k.split("/")[1].removesuffix("_seconds"): avg(k) for k in KEYS if k.startswith("timeline/")},
        "per_step": {k: [history[k].get(s) for s in steps] for k in KEYS},
        **(memory(args.mem) if args.mem else {}),
    }
    args.out.write_text(json.dumps(result, indent=1))
    short = {k: v for k, v in result.items() if k != "per_step"}
    print(json.dumps(short, indent=1))


if __name__ == "__main__":
    main()
