"""Groups of scored samples, the way every GRPO-family app and evaluation gets them, through one protocol
(`Samplers`) with a kind per episode shape, picked once from the env option's schema (`rollout_kind`):

    SingleTurn   the one-step episode: problems → generator.generate (n completions each) → reward workers' score
    MultiTurn    problems → environment workers' episodes (every turn through generator.generate_tokens), scored
                 by the environment

Each kind answers what the loop and the evaluation ask: n scored episodes of a chunk of problems, what a batch of
them reports (its metrics, its rows for samples/completions.json), what an evaluation adds, and the service that
scores. The loop and the evaluation never ask which kind runs.

The problems are split into chunks, `services.generator.replicas × services.generator.in_flight` of them, sent
concurrently: every generator replica has calls in flight (route() spreads them), a replica's engine batches the
calls it holds, and a chunk is scored while the others still generate. The metrics describe the whole call.

A call with a `seed` gives chunk i the seed derive_seed(seed, i) (and a multi-turn episode's turns theirs): what is
drawn depends on the seed and the problems, not on which replica answers or in which order, so a resumed run draws
what the interrupted one would have (driver/checkpoint.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forge_exp.driver.faults import RunFailed
from forge_exp.envs.report import conversation_rows, episode_metrics
from forge_exp.models.sampling import derive_seed
from forge_exp.rewards.combine import component_means
from forge_exp.rl.types import Group, Problem

if TYPE_CHECKING:  # preflight picks the kind before any process starts: no Monarch in this process yet
    from forge_exp.runtime.services import Service


@dataclass
class Samplers:
    """The services that turn problems into scored groups, and what they read of the config (apps/common.py:
    samplers). A kind says how a chunk of problems becomes scored episodes and what its batches report; what every
    kind reports is here."""

    generator: Service
    scorer: Service  # reward workers, or environment workers that score their own episodes (the env's `scorer`)
    response_budget: int  # the most tokens after a prompt: one completion's, or a whole episode's
    in_flight: int = 1  # calls per generator replica at once (services.generator.in_flight)
    reward_functions: tuple[str, ...] = ()  # reward.functions' names, for the errors that name one

    @staticmethod
    def spawn_scorer(runtime, env, reward, model) -> Service:
        """The service that scores the kind's episodes, named as the env option says (env.scorer)."""
        raise NotImplementedError

    @property
    def chunks(self) -> int:
        return self.generator.replicas * self.in_flight

    async def episodes(self, problems: list[Problem], n: int, temperature: float, top_p: float,
                       seed: int | None) -> tuple[list[Group], dict[str, float]]:
        """n scored episodes of each problem of one chunk, and what generating them took (generator/...)."""
        raise NotImplementedError

    def metrics(self, groups: list[Group]) -> dict[str, float]:
        """What the scored groups of one batch (every sampling attempt) say: rewards, accuracy, lengths, the kind's
        own report, each task's accuracy for a mix; policy age is the caller's."""
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
        out.update(self.report(groups))
        out.update(task_accuracy(groups, "rollout"))
        return out

    def report(self, groups: list[Group]) -> dict[str, float]:
        """The kind's own metrics of a batch."""
        raise NotImplementedError

    def rows(self, groups: list[Group]) -> list[dict]:
        """What samples/completions.json shows of a batch."""
        raise NotImplementedError

    async def eval_metrics(self, groups: list[Group], problems: list[Problem], tool_control: bool) -> dict[str, float]:
        """What an evaluation adds to the accuracy of the greedy `groups` of `problems`."""
        return {}

    async def errors(self) -> dict[str, str]:
        """Each reward function's latest failure (what a run stopped for a failing reward reports)."""
        return {}

    @staticmethod
    def check(env, model) -> None:
        """What can be checked of the kind's episodes before any process starts (apps/preflight.py); ValueError."""


@dataclass
class SingleTurn(Samplers):
    """The one-step episode: one generate call of n completions per problem, scored by the reward workers."""

    @staticmethod
    def spawn_scorer(runtime, env, reward, model) -> Service:
        from forge_exp.actors.reward import RewardWorker

        return runtime.spawn(env.scorer, RewardWorker, reward)

    @property
    def reward(self) -> Service:
        """The reward workers (the loop's reward watch asks them for their errors)."""
        return self.scorer

    async def episodes(self, problems, n, temperature, top_p, seed):
        groups, metrics = await self.generator.route().generate.call_one(problems, n, temperature, top_p,
                                                                         self.response_budget, seed=seed)
        return await self.scorer.route().score.call_one(groups), metrics

    def report(self, groups):
        return {f"reward/{k}": v for k, v in component_means(groups).items()}

    def rows(self, groups):
        g = groups[0]  # the batch's first completion
        return [{"version": g.policy_version, "prompt": g.problem.prompt, "completion": g.completions[0].text,
                 "target": g.problem.target, "reward": g.rewards[0]}]

    async def errors(self):
        return await self.scorer.route().errors.call_one()


@dataclass
class MultiTurn(Samplers):
    """Episodes of several turns, each problem's run by the environment workers against a generator replica; the
    environment scores them."""

    env_overrides: dict | None = None  # env fields replaced for these episodes (the no-tool control)

    @staticmethod
    def spawn_scorer(runtime, env, reward, model) -> Service:
        from forge_exp.actors.env import EnvWorker

        return runtime.spawn(env.scorer, EnvWorker, env, model)

    async def episodes(self, problems, n, temperature, top_p, seed):
        return await self.scorer.route().episodes.call_one(problems, self.generator.route(), n, temperature, top_p,
                                                           self.env_overrides, seed)

    @staticmethod
    def check(env, model) -> None:
        """The environment's class takes the env node's arguments, and the model's tokenizer can write its chat
        format: the tiny format's brackets, or a chat template for the others."""
        from forge_exp.config.enums import plain
        from forge_exp.envs.formats import TinyToolFormat
        from forge_exp.runtime.build import build

        build(env, "env", partial=True)  # imports the class and binds its arguments, builds nothing
        fmt = plain(env.chat_format)
        tokenizer = model.tokenizer()
        if fmt == "tiny":
            unknown = getattr(tokenizer, "unk_token_id", None)
            ids = tokenizer(TinyToolFormat.characters, add_special_tokens=False)["input_ids"]
            if unknown is not None and unknown in ids:
                raise ValueError(f"env.chat_format=tiny writes tool calls and results with "
                                 f"{TinyToolFormat.characters!r}, which model.alphabet lacks: add them "
                                 f"(experiment=tool_arithmetic sets model.alphabet to choices.TOOL_ALPHABET)")
        elif not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"env.chat_format={fmt} renders turns with the tokenizer's chat template, and the "
                             f"model's tokenizer has none: use an instruct model, or env.chat_format=tiny for "
                             f"model=tiny")

    def report(self, groups):
        return episode_metrics(groups)  # env/... (envs/report.py)

    def rows(self, groups):
        return conversation_rows(groups, k=2)  # whole conversations, with roles

    async def eval_metrics(self, groups, problems, tool_control):
        """How the policy uses its tools, and, for an environment whose tools can be switched off, the accuracy
        without them (every call answered with an error)."""
        episodes = episode_metrics(groups)
        out = {f"eval/{k}": episodes[f"env/{k}"] for k in ("tool_call_rate", "turns_mean", "malformed_rate")}
        if tool_control:
            without = dataclasses.replace(self, env_overrides={"tools_enabled": False})
            groups, _ = await sample_groups(without, problems, 1, 0.0, 1.0)
            out["eval/accuracy_no_tool"] = statistics.fmean(float(g.correct[0]) for g in groups)
        return out


def rollout_kind(env) -> type[Samplers]:
    """The protocol for the env option's episodes: the one place a run's episode kind is read."""
    return MultiTurn if env.multi_turn else SingleTurn


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
                        seed: int | None = None) -> tuple[list[Group], dict[str, float]]:
    """n scored samples of each problem (groups in the problems' order) and the call's generation metrics. `seed`
    fixes the draws (None: each engine's next seed)."""
    t0 = time.perf_counter()
    seeds = (None if seed is None else derive_seed(seed, i) for i in range(s.chunks))
    parts = await asyncio.gather(*(
        s.episodes(chunk, n, temperature, top_p, chunk_seed)
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


def task_accuracy(groups: list[Group], prefix: str) -> dict[str, float]:
    """`<prefix>/<task>/accuracy` for each task of a mix (problems that name their task: data/reasoning_gym.py);
    nothing for a single-task source."""
    correct: dict[str, list[float]] = {}
    for g in groups:
        if g.problem.task:
            correct.setdefault(g.problem.task, []).extend(float(c) for c in g.correct)
    return {f"{prefix}/{task}/accuracy": statistics.fmean(values) for task, values in sorted(correct.items())}
