"""Environment workers on real proc meshes: two replicas of them run multi-turn episodes against two generator
replicas (calls spread by route(), several in flight), and a hanging step is a failed turn, never a dead run."""

from __future__ import annotations

import asyncio

import pytest

from forge_exp.apps.common import RolloutPlan
from forge_exp.apps.rollout import MultiTurn, Samplers, sample_groups
from forge_exp.rl.types import Problem
from forge_exp.runtime.layout import plan_for
from forge_exp.runtime.services import Runtime
from tests.config.helpers import typed

PROBLEMS = [Problem(f"{1000 + i}*{2000 + i}=", str((1000 + i) * (2000 + i))) for i in range(8)]


def config(*extra: str):
    return typed("experiment=tool_arithmetic", "services.env.mesh=env", "services.env.replicas=2",
                 "services.generator.replicas=2",
                 "services.generator.in_flight=2", *extra)


async def sample(cfg, n: int) -> tuple[list, dict, Samplers]:
    async with Runtime(plan_for(cfg)) as runtime:
        plan = RolloutPlan.of(cfg)
        s = plan.samplers(plan.spawn_generator(runtime), plan.spawn_scorer(runtime))  # env workers, 2 calls in flight
        groups, metrics = await sample_groups(s, PROBLEMS, n, 1.0, 1.0)
    return groups, metrics, s


@pytest.mark.slow
def test_episodes_on_environment_workers_carry_every_turn_and_a_loss_mask():
    cfg = config()
    plans = plan_for(cfg)
    assert plans["env"].replicas == 2 and not any("reward" in plan.services for plan in plans.values())
    groups, metrics, s = asyncio.run(sample(cfg, 4))
    assert isinstance(s, MultiTurn)
    assert [g.problem for g in groups] == PROBLEMS and all(len(g.completions) == 4 for g in groups)
    assert metrics["generator/calls"] == 4 == s.chunks  # 2 generator replicas x 2 calls in flight
    for c in (c for g in groups for c in g.completions):
        assert len(c.loss_mask) == len(c.token_ids) == len(c.logprobs) and c.policy_version == 0
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if not m)  # inserted: no behaviour logprob
        assert c.messages[0]["role"] == "user" and c.messages[1]["role"] == "assistant"
    report = s.metrics(groups)
    assert report["env/episodes"] == 32 and 1 <= report["env/turns_mean"] <= cfg.env.max_turns


@pytest.mark.slow
def test_a_hanging_step_is_a_failed_turn_not_a_dead_run():
    cfg = config("env._target_=tests.actors.hanging_env.HangingCalculator", "env.tool_timeout_s=0.5")
    groups, _, s = asyncio.run(sample(cfg, 4))
    report = s.metrics(groups)
    assert len(groups) == len(PROBLEMS) and report["env/episodes"] == 32
    failed = [c for g in groups for c in g.completions if c.stop_reason == "failed"]
    # a fresh model ends about half its turns with <eos> inside 20 tokens: each of those is a step, which hangs
    assert failed and report["env/failed_turns"] == len(failed)
    assert all(r == cfg.env.failure_reward for g in groups for r, c in zip(g.rewards, g.completions)
               if c.stop_reason == "failed")
