"""Groups of scored samples, the way every GRPO-family app and evaluation gets them:

    env=single_turn   problems → generator.generate (n completions each) → reward workers' score
    multi-turn env    problems → environment workers' episodes (every turn through generator.generate_tokens)

The problems are split into chunks, `services.generator.replicas × services.generator.in_flight` of them, sent
concurrently: every generator replica has calls in flight (route() spreads them), a replica's engine batches the
calls it holds, and a chunk is scored while the others still generate. The metrics describe the whole call.

A call with a `seed` gives chunk i the seed derive_seed(seed, i) (and a multi-turn episode's turns theirs): what is
drawn depends on the seed and the problems, not on which replica answers or in which order, so a resumed run draws
what the interrupted one would have (driver/checkpoint.py).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from forge_exp.driver.faults import RunFailed
from forge_exp.envs.report import episode_metrics
from forge_exp.models.sampling import derive_seed
from forge_exp.rewards.combine import component_means
from forge_exp.rl.types import Group, Problem
from forge_exp.runtime.services import Service


@dataclass
class Samplers:
    """The services that turn problems into scored groups: reward workers for single-turn runs, environment
    workers for multi-turn ones (the other is None), and what they read of the config (apps/common.py: samplers)."""

    generator: Service
    reward: Service | None = None
    env: Service | None = None
    in_flight: int = 1  # calls per generator replica at once (services.generator.in_flight)
    max_new_tokens: int = 0  # a single-turn completion's budget (dataset.max_new_tokens)
    reward_functions: tuple[str, ...] = ()  # reward.functions' names, for the errors that name one

    @property
    def chunks(self) -> int:
        return self.generator.replicas * self.in_flight

    @property
    def multi_turn(self) -> bool:
        return self.env is not None


def chunked(items: list, count: int) -> list[list]:
    """`items` in at most `count` contiguous chunks of nearly equal size (order kept, none empty)."""
    count = max(1, min(count, len(items)))
    size, extra = divmod(len(items), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


async def sample_groups(s: Samplers, problems: list[Problem], n: int, temperature: float, top_p: float,
                        env_overrides: dict | None = None, seed: int | None = None,
                        ) -> tuple[list[Group], dict[str, float]]:
    """n scored samples of each problem (groups in the problems' order) and the call's generation metrics. `seed`
    fixes the draws (None: each engine's next seed)."""
    t0 = time.perf_counter()
    seeds = (None if seed is None else derive_seed(seed, i) for i in range(s.chunks))
    parts = await asyncio.gather(*(
        _sample_chunk(s, chunk, n, temperature, top_p, env_overrides, chunk_seed)
        for chunk, chunk_seed in zip(chunked(problems, s.chunks), seeds)
    ))
    seconds = time.perf_counter() - t0
    groups = [g for chunk_groups, _ in parts for g in chunk_groups]
    check_rewards(s.reward_functions, groups)
    tokens = sum(m["generator/tokens"] for _, m in parts)
    metrics = {
        "generator/seconds": seconds,
        "generator/tokens": tokens,
        "generator/tokens_per_s": tokens / max(seconds, 1e-9),
        "generator/calls": float(len(parts)),
    }
    if "generator/sync_seconds" in parts[0][1]:
        metrics["generator/sync_seconds"] = max(m["generator/sync_seconds"] for _, m in parts)
    return groups, metrics


async def _sample_chunk(s: Samplers, problems, n, temperature, top_p, env_overrides, seed):
    if s.multi_turn:
        return await s.env.route().episodes.call_one(problems, s.generator.route(), n, temperature, top_p,
                                                     env_overrides, seed)
    groups, metrics = await s.generator.route().generate.call_one(problems, n, temperature, top_p,
                                                                  s.max_new_tokens, seed=seed)
    return await s.reward.route().score.call_one(groups), metrics


FLOAT32_MAX = 3.4028234663852886e38  # advantages and the loss carry rewards as float32 (rl/advantages.py)


def check_rewards(reward_functions: tuple[str, ...], groups: list[Group]) -> None:
    """Every completion's reward must be a finite float32: a larger one (±1e308, a weighted sum that overflowed)
    would end as inf or NaN in the means, the advantages and the loss. RunFailed names the reward function whose
    value is largest."""
    for g in groups:
        for total, parts in zip(g.rewards, g.components or [{}] * len(g.rewards)):
            if math.isfinite(total) and abs(total) <= FLOAT32_MAX:
                continue
            values = {k: v for k, v in parts.items() if not k.startswith("failed/")} or {"reward": total}
            name = max(values, key=lambda k: abs(values[k]) if not math.isnan(values[k]) else math.inf)
            who = f"reward.functions.{name}" if name in reward_functions else f"the reward ({name})"
            raise RunFailed(f"{who} returned {values[name]:g} (the completion's reward: {total:g}): rewards are "
                            f"carried as float32, whose range ends at ±3.4e+38, and their means and advantages "
                            f"would not be finite; return values well inside it")


def rollout_metrics(groups: list[Group], multi_turn: bool) -> dict[str, float]:
    """What the scored groups of one batch (every sampling attempt) say: rewards and their parts, accuracy, policy
    age is the caller's; a multi-turn batch adds env/... (envs/report.py)."""
    rewards = [r for g in groups for r in g.rewards]
    completions = [c for g in groups for c in g.completions]
    out: dict[str, Any] = {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/failures": float(sum(g.reward_failures for g in groups)),
        "rollout/accuracy": statistics.fmean(float(c) for g in groups for c in g.correct),
        "rollout/response_length": statistics.fmean(len(c.token_ids) for c in completions),  # tokens
        "rollout/truncated_frac": statistics.fmean(float(c.truncated) for c in completions),
    }
    if multi_turn:
        out.update(episode_metrics(groups))
    else:
        out.update({f"reward/{k}": v for k, v in component_means(groups).items()})
    out.update(task_accuracy(groups, "rollout"))
    return out


def task_accuracy(groups: list[Group], prefix: str) -> dict[str, float]:
    """`<prefix>/<task>/accuracy` for each task of a mix (problems that name their task: data/reasoning_gym.py);
    nothing for a single-task source."""
    correct: dict[str, list[float]] = {}
    for g in groups:
        if g.problem.task:
            correct.setdefault(g.problem.task, []).extend(float(c) for c in g.correct)
    return {f"{prefix}/{task}/accuracy": statistics.fmean(values) for task, values in sorted(correct.items())}
