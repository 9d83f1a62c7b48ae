"""The rollout protocol (apps/rollout.py): the env option picks its kind once, and each kind answers what the loop
and the evaluation ask with the metric names and samples/completions.json rows runs had before there was a
protocol (the expected values below are what the loop computed then, on these groups). Fake services stand in for
the generator, reward and environment workers: no process starts."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from types import SimpleNamespace

import pytest

from forge_exp.apps.common import EvalPlan, RolloutPlan, evaluate, generator_sizes
from forge_exp.apps.rollout import MultiTurn, SingleTurn, rollout_kind, sample_groups
from forge_exp.rl.types import Completion, Group, Problem
from forge_exp.runtime.layout import plan_for
from tests.conftest import ROOT
from tests.config.helpers import typed

TOOLS = "experiment=tool_arithmetic"


def completion(tokens, stop="eos", version=3, text="", info=None, messages=None) -> Completion:
    return Completion(prompt_ids=[1, 2], token_ids=list(range(tokens)), logprobs=[-0.5] * tokens, stop_reason=stop,
                      policy_version=version, text=text, info=info or {}, messages=messages)


def single_turn_groups() -> list[Group]:
    return [
        Group(Problem("1+2=", "3", task="add"), [completion(2, text="3"), completion(4, "length", text="12")],
              rewards=[1.0, 0.25], components=[{"correct": 1.0, "format": 0.5}, {"correct": 0.0, "format": 0.25}],
              correct=[True, False], reward_failures=1),
        Group(Problem("2*3=", "6", task="mul"), [completion(1, text="6", version=2), completion(3, text="7")],
              rewards=[1.0, 0.0], components=[{"correct": 1.0}, {"correct": 0.0, "format": 1.0}],
              correct=[True, False]),
    ]


TALK = [{"role": "user", "content": "12*13=?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": "12*13"}}]},
        {"role": "tool", "content": "156"}, {"role": "assistant", "content": "156"}]
CALLED = {"turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0, "malformed_calls": 1.0, "reset_failures": 0.0}


def multi_turn_groups() -> list[Group]:
    return [
        Group(Problem("12*13=", "156"), [completion(6, info=CALLED, messages=TALK),
                                         completion(3, "max_turns", info={"turns": 1.0})],
              rewards=[1.0, 0.0], components=[{"correct": 1.0}, {"correct": 0.0, "malformed": -0.5}],
              correct=[True, False]),
        Group(Problem("7*8=", "56"), [completion(2, version=2, info={"turns": 1.0}, messages=TALK[:1]),
                                      completion(5, "failed", info=CALLED, messages=TALK)],
              rewards=[0.0, 1.0], components=[{"correct": 0.0}, {"correct": 1.0}], correct=[False, True]),
    ]


SHARED = {"reward/mean", "reward/std", "reward/failures", "rollout/accuracy", "rollout/response_length",
          "rollout/truncated_frac"}


class Service:
    """A service handle's shape (runtime/services.py: route().<endpoint>.call_one) over plain functions; `calls`
    records each call's endpoint and arguments."""

    replicas = 1

    def __init__(self, **endpoints):
        self.endpoints, self.calls = endpoints, []

    def route(self):
        return SimpleNamespace(**{name: SimpleNamespace(call_one=self._caller(name, fn))
                                  for name, fn in self.endpoints.items()})

    def _caller(self, name, fn):
        async def call_one(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return fn(*args, **kwargs)
        return call_one


def generator() -> Service:
    def generate(problems, n, temperature, top_p, max_new_tokens, seed=None):
        return [Group(p, [completion(2, text=p.target) for _ in range(n)]) for p in problems], {
            "generator/tokens": 2.0 * n * len(problems)}
    return Service(generate=generate)


def reward_workers() -> Service:
    def score(groups):
        for g in groups:
            n = len(g.completions)
            g.rewards, g.components, g.correct = [1.0] * n, [{"correct": 1.0}] * n, [True] * n
        return groups
    return Service(score=score, errors=lambda: {"correct": "ValueError: boom"})


def env_workers() -> Service:
    """Episodes that call the tool and are right, or, with the tools switched off, are wrong."""
    def episodes(problems, generator_route, n, temperature, top_p, overrides, seed):
        tools = not (overrides or {}).get("tools_enabled") is False
        info = CALLED if tools else {"turns": 1.0}
        return [Group(p, [completion(3, info=info, messages=TALK) for _ in range(n)], rewards=[float(tools)] * n,
                      components=[{"correct": float(tools)}] * n, correct=[tools] * n)
                for p in problems], {"generator/tokens": 3.0 * n * len(problems)}
    return Service(episodes=episodes)


def test_the_env_option_picks_the_kind():
    assert rollout_kind(typed().env) is SingleTurn
    assert rollout_kind(typed(TOOLS).env) is MultiTurn
    assert rollout_kind(typed("env=openenv").env) is MultiTurn


def test_the_kind_is_read_in_one_place():
    """Single- or multi-turn is decided by the env option's schema (config/env.py) and read by rollout_kind alone;
    everything else asks the protocol or the schema's answers (scorer, budgets, tool control)."""
    readers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "forge_exp").rglob("*.py")
                     if re.search(r"\.multi_turn\b", p.read_text()))
    assert readers == ["forge_exp/apps/rollout.py"], readers


def test_the_kind_is_picked_once_when_the_run_is_built():
    """The apps pick the kind once, in their view of the config (RolloutPlan.of), and pass the plan on; preflight
    asks it once, before any process starts. No other place calls rollout_kind."""
    calls = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "forge_exp").rglob("*.py"))
             if (n := len(re.findall(r"(?<!def )\brollout_kind\(", p.read_text())))}
    assert calls == {"forge_exp/apps/common.py": 1, "forge_exp/apps/preflight.py": 1}, calls


ENTRY_POINTS = {  # what may take the whole config: the apps' entry points, the views' `of`, the run's own decisions
    "__init__.py": {"run_app", "_grpo"}, "grpo.py": {"build"}, "sft.py": {"run"}, "eval.py": {"run"},
    "preflight.py": {"check", "resolve_model"}, "rundir.py": {"own_dirs"},
}


def test_the_apps_helpers_take_values_not_the_config():
    """Each app reads the config once, when it builds its run, into typed views; its helpers take those or plain
    values."""
    import ast

    takers = set()
    for path in sorted((ROOT / "forge_exp" / "apps").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "of" and {
                    a.arg for a in node.args.args + node.args.kwonlyargs} & {"cfg", "config"}:
                takers.add((path.name, node.name))
    assert {t for t in takers if t[1] not in ENTRY_POINTS.get(t[0], ())} == set()


def test_single_turn_reports_what_a_single_turn_batch_always_reported():
    s = SingleTurn(generator(), reward_workers(), 8)
    assert s.metrics(single_turn_groups()) == {
        "reward/mean": 0.5625, "reward/std": 0.44633927678392815, "reward/failures": 1.0, "rollout/accuracy": 0.5,
        "rollout/response_length": 2.5, "rollout/truncated_frac": 0.25, "reward/correct": 0.5,
        "reward/format": 0.4375, "rollout/add/accuracy": 0.5, "rollout/mul/accuracy": 0.5,
    }
    assert s.rows(single_turn_groups()) == [
        {"version": 3, "prompt": "1+2=", "completion": "3", "target": "3", "reward": 1.0}]


def test_multi_turn_reports_what_a_multi_turn_batch_always_reported():
    s = MultiTurn(generator(), env_workers(), 1024)
    metrics = s.metrics(multi_turn_groups())
    assert metrics == {
        "reward/mean": 0.5, "reward/std": 0.5, "reward/failures": 0.0, "rollout/accuracy": 0.5,
        "rollout/response_length": 4.0, "rollout/truncated_frac": 0.25, "env/episodes": 4.0, "env/turns_mean": 1.5,
        "env/tool_calls": 2.0, "env/tool_call_rate": 0.5, "env/tool_errors": 0.0, "env/malformed_calls": 2.0,
        "env/malformed_rate": 0.5, "env/failed_turns": 0.0, "env/truncated": 0.25, "env/tokens_mean": 4.0,
        "env/reset_failures": 0.0, "env/reward/correct": 0.5, "env/reward/malformed": -0.125,
    }
    assert SHARED <= set(metrics) and SHARED <= set(SingleTurn(generator(), reward_workers(), 8).metrics(
        single_turn_groups()))  # what every kind reports
    rows = s.rows(multi_turn_groups())
    assert rows == [
        {"version": 3, "prompt": "12*13=", "conversation": "user: 12*13=?\nassistant: -> calc(12*13)\ntool: 156\n"
         "assistant: 156", "target": "156", "reward": 1.0, "turns": 2.0, "stop_reason": "eos"},
        {"version": 2, "prompt": "7*8=", "conversation": "user: 12*13=?", "target": "56", "reward": 0.0,
         "turns": 1.0, "stop_reason": "eos"},
    ]


PROBLEMS = [Problem(f"{i}+1=", str(i + 1)) for i in range(5)]


def test_single_turn_is_one_generate_call_per_chunk_scored_by_the_reward_workers():
    gen, rewards = generator(), reward_workers()
    s = SingleTurn(gen, rewards, response_budget=8, in_flight=2)
    groups, metrics = asyncio.run(sample_groups(s, PROBLEMS, 3, 1.0, 1.0, seed=7))
    assert [g.problem for g in groups] == PROBLEMS and all(g.correct == [True] * 3 for g in groups)
    assert metrics["generator/calls"] == 2.0 and metrics["generator/tokens"] == 30.0
    assert [len(args[0]) for name, args, _ in gen.calls] == [3, 2]  # two chunks, in the problems' order
    assert {args[4] for _, args, _ in gen.calls} == {8}  # the one step's budget: the response budget
    assert [name for name, _, _ in rewards.calls] == ["score", "score"]
    assert asyncio.run(s.errors()) == {"correct": "ValueError: boom"}


def test_evaluation_adds_what_the_kind_adds():
    plan = EvalPlan(pass_k=0, temperature=0.7, seed=0, no_tool_control=True)
    single = asyncio.run(evaluate(SingleTurn(generator(), reward_workers(), 8), PROBLEMS, 0, plan))
    assert single == {"eval/accuracy": 1.0, "eval/reward": 1.0}
    env = env_workers()
    multi = asyncio.run(evaluate(MultiTurn(generator(), env, 1024), PROBLEMS, 0, plan))
    assert multi == {"eval/accuracy": 1.0, "eval/reward": 1.0, "eval/tool_call_rate": 1.0, "eval/turns_mean": 2.0,
                     "eval/malformed_rate": 0.5, "eval/accuracy_no_tool": 0.0}
    assert [args[5] for _, args, _ in env.calls] == [None, {"tools_enabled": False}]  # the no-tool control
    plain = asyncio.run(evaluate(MultiTurn(generator(), env_workers(), 1024), PROBLEMS, 0,
                                 dataclasses.replace(plan, no_tool_control=False)))
    assert "eval/accuracy_no_tool" not in plain and "eval/tool_call_rate" in plain


class Runtime:
    def __init__(self):
        self.spawned = []

    def spawn(self, name, actor, *args, **kwargs):
        self.spawned.append((name, actor.__name__))
        return Service()


@pytest.mark.parametrize("overrides, kind, scorer, worker", [
    ((), SingleTurn, "reward", "RewardWorker"),
    ((TOOLS,), MultiTurn, "env", "EnvWorker"),
])
def test_the_run_builds_the_kind_its_env_names(overrides, kind, scorer, worker):
    cfg = typed(*overrides)
    runtime = Runtime()
    plan = RolloutPlan.of(cfg)
    assert plan.kind is kind
    spawned = plan.spawn_scorer(runtime)
    assert runtime.spawned == [(scorer, worker)]
    s = plan.samplers(generator(), spawned)
    assert type(s) is kind and s.scorer is spawned and s.response_budget == cfg.env.response_budget(cfg.dataset)
    services = {name for plan in plan_for(cfg).values() for name in plan.services}
    assert scorer in services and ({"reward", "env"} - {scorer}).isdisjoint(services)


def test_the_budgets_are_the_env_options():
    single, multi = typed(), typed(TOOLS)
    assert RolloutPlan.of(single).response_budget == single.dataset.max_new_tokens
    assert RolloutPlan.of(multi).response_budget == multi.env.max_total_tokens
    for cfg, longest in ((single, single.dataset.prompt_budget + single.dataset.max_new_tokens),
                         (multi, multi.env.max_total_tokens + multi.env.turn_tokens)):
        a = cfg.algorithm
        sizes = {"slots": a.prompts_per_step * a.group_size * (a.max_policy_age + 1), "max_len": longest,
                 "max_model_len": longest}
        assert generator_sizes(a, cfg.env, cfg.dataset) == sizes == RolloutPlan.of(cfg).sizes
    sft = typed("algorithm=sft", "mode=eval")
    assert generator_sizes(sft.algorithm, sft.env, sft.dataset)["slots"] == 64  # an algorithm that samples none
