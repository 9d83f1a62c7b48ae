"""The tool_arithmetic experiment in one process: warm start on a few tool-use demonstrations, then GRPO over
multi-turn calculator episodes, measuring held-out accuracy with and without the tool.

    .venv/bin/python benchmarks/tool_arithmetic.py                       # results/tool_arithmetic_cpu.json
    .venv/bin/python benchmarks/tool_arithmetic.py --seed 1 --out /tmp/r.json

The same pieces the platform's loop uses (envs.run_episodes, rl.episodes, data.collate,
trainers.update.policy_update with GRPOLoss), without services: the generator is the policy itself, in this process, so
every episode is on-policy. The warm start is cached under ~/.cache/forge-exp/warmstart, keyed by its settings.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from forge_exp.data.collate import collate_episodes
from forge_exp.data.tool_arithmetic import collate_demonstrations, cycle, demonstrations, tool_task
from forge_exp.envs import CalculatorEnv, EpisodeLimits, Sampling, TinyToolFormat, episode_metrics, run_episodes
from forge_exp.envs.local import local_generate
from forge_exp.models.checkpoint import save_hf_checkpoint
from forge_exp.models.hf import load_causal_lm
from forge_exp.models.tiny import TinyQwen3
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer
from forge_exp.models.warmstart import warmstart
from forge_exp.rl.episodes import group_advantages, to_episodes
from forge_exp.rl.filters import has_mixed_rewards
from forge_exp.rl.losses import GRPOLoss
from forge_exp.trainers.update import Policy, policy_update

LIMITS = EpisodeLimits(max_turns=3, max_total_tokens=64, tool_timeout_s=5.0)
TURN_TOKENS = 20  # a 4-digit product has at most 8 digits; a call [dddd*dddd] is 11 characters


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--prompts", type=int, default=16, help="problems per GRPO step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=0.7, help="rollout sampling (the loss uses the same)")
    p.add_argument("--demos", type=int, default=256, help="distinct warm-start demonstrations")
    p.add_argument("--direct-fraction", type=float, default=0.5, help="demonstrations that answer without the tool")
    p.add_argument("--ws-steps", type=int, default=600)
    p.add_argument("--ws-target", type=float, default=0.3, help="stop the warm start at this training accuracy")
    p.add_argument("--eval-size", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/forge-exp/warmstart"))
    p.add_argument("--shuffle-rewards", action="store_true", help="control: permute rewards within each batch")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "tool_arithmetic_cpu.json"))
    return p.parse_args()


def warm_started_model(args, tokenizer, fmt, task):
    key = json.dumps({k: getattr(args, k) for k in ("seed", "demos", "direct_fraction", "ws_steps", "ws_target")}
                     | {"alphabet": TOOL_ALPHABET, "v": 1}, sort_keys=True)
    cache = Path(args.cache_dir) / f"tool-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if (cache / "config.json").exists():
        return load_causal_lm(str(cache), "float32", "sdpa", False), {"warmstart/cached": 1.0}
    model = TinyQwen3(alphabet=TOOL_ALPHABET, seed=args.seed).build()
    stream = task.train_stream(args.seed + 1)
    demos = demonstrations([next(stream) for _ in range(args.demos)], tokenizer, fmt, direct_fraction=args.direct_fraction, seed=args.seed)
    metrics = warmstart(model, tokenizer, cycle(demos, args.seed), steps=args.ws_steps, lr=1e-3, batch_size=64,
                        target_accuracy=args.ws_target, collate=collate_demonstrations)
    save_hf_checkpoint(model, tokenizer, cache)
    return model, metrics


async def evaluate(model, tokenizer, fmt, problems, rng) -> dict[str, float]:
    """Greedy held-out accuracy with the tool, and with every tool call answered by an error."""
    model.eval()
    gen = local_generate(model, tokenizer, generator=rng)
    out = {}
    for name, enabled in (("tool", True), ("no_tool", False)):
        groups = await run_episodes(lambda: CalculatorEnv(system_prompt=None, tools_enabled=enabled), problems, 1, gen,
                                    tokenizer, fmt, Sampling(temperature=0.0, max_new_tokens=TURN_TOKENS), LIMITS)
        out[f"eval/accuracy_{name}"] = statistics.fmean(float(g.correct[0]) for g in groups)
        if enabled:
            m = episode_metrics(groups)
            out |= {f"eval/{k[4:]}": m[k] for k in ("env/tool_call_rate", "env/turns_mean", "env/malformed_rate")}
    return out


async def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    tokenizer, fmt, task = build_char_tokenizer(TOOL_ALPHABET), TinyToolFormat(), tool_task(eval_size=args.eval_size)
    model, ws = warm_started_model(args, tokenizer, fmt, task)
    t_ws = time.perf_counter() - t0
    rng = torch.Generator().manual_seed(args.seed)
    heldout = task.heldout()
    history = [{"step": 0, **await evaluate(model, tokenizer, fmt, heldout, rng)}]
    print(json.dumps(history[0]), flush=True)
    loss = GRPOLoss(beta=0.0, loss_agg="token_mean")
    policy = Policy(torch.device("cpu"), model, tokenizer, torch.optim.AdamW(model.parameters(), lr=args.lr), loss)
    stream, gen = task.train_stream(args.seed + 100), local_generate(model, tokenizer, generator=rng)
    sampling = Sampling(temperature=args.temperature, max_new_tokens=TURN_TOKENS)
    steps = []
    t_rl = time.perf_counter()
    for step in range(1, args.steps + 1):
        s0 = time.perf_counter()
        model.eval()
        problems = [next(stream) for _ in range(args.prompts)]
        groups = await run_episodes(lambda: CalculatorEnv(system_prompt=None), problems, args.group_size, gen,
                                    tokenizer, fmt, sampling, LIMITS)
        rollout = episode_metrics(groups) | {
            "reward/mean": statistics.fmean(r for g in groups for r in g.rewards),
            "rollout/accuracy": statistics.fmean(float(c) for g in groups for c in g.correct),
        }
        if args.shuffle_rewards:  # control: the same rewards, detached from the episodes that earned them
            flat = [r for g in groups for r in g.rewards]
            perm = torch.randperm(len(flat), generator=rng).tolist()
            for i, g in enumerate(groups):
                g.rewards = [flat[perm[i * args.group_size + j]] for j in range(len(g.rewards))]
        kept = [g for g in groups if has_mixed_rewards(g)]  # zero-variance groups carry no gradient
        train = {}
        if kept:
            batch = collate_episodes(to_episodes(kept, group_advantages(kept, "group_norm", 1e-6)),
                                     tokenizer.pad_token_id)
            train = policy_update(policy, batch, grad_accum=1, max_grad_norm=1.0,
                                  temperature=args.temperature)
        steps.append({"step": step, "seconds": time.perf_counter() - s0, "groups_kept": len(kept), **rollout,
                      **{k: v for k, v in train.items() if k.startswith(("loss/", "train/grad"))}})
        if step % args.eval_every == 0 or step == args.steps:
            history.append({"step": step, **await evaluate(model, tokenizer, fmt, heldout, rng)})
            print(json.dumps({**history[-1], "rollout/accuracy": rollout["rollout/accuracy"],
                              "env/tool_call_rate": rollout["env/tool_call_rate"]}), flush=True)
    t_end = time.perf_counter()
    result = {
        "command": "python benchmarks/tool_arithmetic.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "cache_dir")),
        "machine": f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "warmstart": ws, "warmstart_seconds": t_ws, "rl_seconds": t_end - t_rl, "total_seconds": t_end - t0,
        "start": history[0], "end": history[-1], "evals": history, "steps": steps,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(_dump(result))
    print(json.dumps({k: result[k] for k in ("warmstart_seconds", "rl_seconds", "total_seconds", "start", "end")}))


def _dump(result: dict) -> str:
    """Top-level keys one per line, each step / evaluation on one line (diffable, not 4,000 lines)."""
    lines = []
    for k, v in result.items():
        if isinstance(v, list):
            lines.append(f" {json.dumps(k)}: [\n" + ",\n".join("  " + json.dumps(x) for x in v) + "\n ]")
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    asyncio.run(main())
