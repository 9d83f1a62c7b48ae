"""Weighted combination, failure handling, and building rewards from config `_target_`s."""

import math
import textwrap

import pytest

from forge_exp.config.reward import RewardConfig
from forge_exp.rewards import MathReward, ThinkingReward, WeightedReward, score_group
from forge_exp.rl.types import Problem
from forge_exp.runtime.build import build_reward as build_from_config

MATH = "forge_exp.rewards.math.MathReward"


def build_reward(functions: dict, failure_value: float = 0.0) -> WeightedReward:
    """What the reward worker does with `reward.functions`: the schema's structure checks, then every target built."""
    return build_from_config(RewardConfig(name="test", functions=functions, failure_value=failure_value))

RESPONSE = "<think>6 times 7</think><answer>42</answer>"


def raises(prompt, response, target):
    raise RuntimeError("grader crashed")


def returns_nan(prompt, response, target):
    return float("nan")


def test_weighted_sum_and_components():
    reward = WeightedReward({"correct": (MathReward(), 1.0), "thinking": (ThinkingReward(), 0.25)})
    total, parts = reward("Q", RESPONSE, "42")
    assert total == pytest.approx(1.25)
    assert parts == {"correct": 1.0, "failed/correct": 0.0, "thinking": 1.0, "failed/thinking": 0.0}
    total, parts = reward("Q", "<answer>41</answer>", "42")
    assert (total, parts["correct"], parts["thinking"]) == (0.0, 0.0, 0.0)


def test_negative_weights_are_penalties():
    reward = WeightedReward({"correct": (MathReward(), 1.0), "long": (lambda p, r, t: len(r) / 100, -0.5)})
    total, _ = reward("Q", "<answer>42</answer>", "42")
    assert total == pytest.approx(1.0 - 0.5 * len("<answer>42</answer>") / 100)


@pytest.mark.parametrize("bad", [raises, returns_nan, lambda p, r, t: math.inf, lambda p, r, t: None])
def test_a_failing_function_scores_failure_value_and_is_counted(bad, caplog):
    reward = WeightedReward({"correct": (MathReward(), 1.0), "bad": (bad, 2.0)}, failure_value=-1.0)
    total, parts = reward("Q", RESPONSE, "42")
    assert parts["bad"] == -1.0 and parts["failed/bad"] == 1.0
    assert parts["correct"] == 1.0 and parts["failed/correct"] == 0.0
    assert total == pytest.approx(1.0 + 2.0 * -1.0)
    reward("Q", RESPONSE, "42")
    assert reward.failure_counts == {"correct": 0, "bad": 2}
    assert len([r for r in caplog.records if "'bad' failed" in r.getMessage()]) == 1  # logged once


def test_score_group_counts_completions_with_failures():
    flaky = lambda p, r, t: 1.0 if "ok" in r else float("nan")  # noqa: E731
    reward = WeightedReward({"correct": (MathReward(), 1.0), "flaky": (flaky, 0.5)})
    problem = Problem(prompt="What is 6*7?", target="42", question="6*7")
    totals, components, failures = score_group(reward, problem, ["<answer>42</answer> ok", "<answer>42</answer>", "no"])
    assert totals == pytest.approx([1.5, 1.0, 0.0])
    assert failures == 2
    assert [c["failed/flaky"] for c in components] == [0.0, 1.0, 1.0]


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A researcher's own module with a torchforge-style reward class, importable by dotted path."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent('''
        class LengthPenalty:
            """torchforge's protocol: __call__(self, prompt, response, target) -> float"""
            def __init__(self, max_len: int, scale: float = 1.0):
                if max_len < 1:
                    raise ValueError(f"max_len must be >= 1, got {max_len}")
                self.max_len, self.scale = max_len, scale

            def __call__(self, prompt: str, response: str, target: str) -> float:
                return -self.scale * max(0, len(response) - self.max_len)

        def contains_target(prompt, response, target, bonus=1.0):
            return bonus if target in response else 0.0

        def not_a_reward(text):
            return 0.0

        class NeedsAJudge:
            def __init__(self):
                raise RuntimeError("no judge model on this machine")

            def __call__(self, prompt, response, target):
                return 0.0
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_build_reward_with_user_targets(user_package):
    reward = build_reward({
        "correct": {"_target_": MATH, "weight": 1.0, "fallback_last_number": False},
        "length": {"_target_": f"{user_package}.LengthPenalty", "weight": 0.5, "max_len": 10},
        "contains": {"_target_": f"{user_package}.contains_target", "weight": 2.0, "bonus": 0.25},
    })
    total, parts = reward("Q", "<answer>42</answer>", "42")  # 19 characters: 9 too many
    assert parts == {"correct": 1.0, "failed/correct": 0.0, "length": -9.0, "failed/length": 0.0,
                     "contains": 0.25, "failed/contains": 0.0}
    assert total == pytest.approx(1.0 - 4.5 + 0.5)
    assert build_reward({"c": {"_target_": "forge_exp.rewards.math.MathReward"}}).functions["c"][1] == 1.0


@pytest.mark.parametrize(
    ("functions", "message"),
    [
        ({"x": {"_target_": "no_such_pkg.Reward"}}, r"reward\.functions\.x\._target_: cannot import 'no_such_pkg"),
        ({"x": {"_target_": "my_rewards.Missing"}}, r"reward\.functions\.x\._target_: cannot import 'my_rewards.Missing' .*importable from module 'my_rewards'"),
        ({"x": {"_target_": "my_rewards.not_a_reward"}}, r"reward\.functions\.x\._target_: .* not a reward"),
        ({"x": {"weight": 1.0}}, r"functions\.x\._target_ is missing"),
        ({"x": {"_target_": "my_rewards.LengthPenalty", "max_lne": 3}},
         r"reward\.functions\.x\.max_lne: .* \(did you mean 'max_len'\?\)"),
        ({"x": {"_target_": "my_rewards.LengthPenalty"}}, r"reward\.functions\.x: .* needs max_len"),
        ({"x": {"_target_": "my_rewards.LengthPenalty", "max_len": 0}}, r"reward\.functions\.x\.max_len must be >= 1"),
        ({"x": {"_target_": MATH, "weight": "heavy"}}, r"functions\.x\.weight must be a finite number"),
        ({"x": {"_target_": MATH, "weight": float("inf")}}, r"functions\.x\.weight"),
        ({"a/b": {"_target_": MATH}}, r"name 'a/b'"),
        ({"x": {"_target_": "my_rewards.NeedsAJudge"}},  # its __init__'s own error, with the key and the class
         r"^reward\.functions\.x \(my_rewards\.NeedsAJudge\) raised RuntimeError: no judge model on this machine$"),
        ({"x": {"_target_": "builtins.len"}},
         r"^reward\.functions\.x\._target_: builtins\.len is not a reward function"),
    ],
)
def test_build_reward_errors_name_the_key(user_package, functions, message):
    with pytest.raises(ValueError, match=message):
        build_reward(functions)


def test_every_reward_yaml_builds_and_grades(tmp_path):
    """Each conf/reward option, as composed, builds (every _target_ imported, every kwarg checked); the math-style
    rewards all give full marks to a well-formed right answer."""
    from omegaconf import OmegaConf

    from tests.config.helpers import compose_cfg, options

    for name in options("reward"):
        cfg = OmegaConf.to_object(compose_cfg(f"reward={name}")).reward
        reward = build_from_config(cfg)
        if name != "arithmetic":
            problem = None
            if name == "reasoning_gym":  # the task's own verifier reads the entry
                entry = {"question": "6 * 7 =", "answer": "42", "metadata": {"source_dataset": "chain_sum"}}
                problem = Problem("Q", "42", task="chain_sum", info=entry)
            total, parts = reward("Q", "<think>6 times 7</think><answer>42</answer>", "42", problem)
            assert total == pytest.approx(sum(w for _, w in reward.functions.values())), name
            assert set(parts) == {*reward.names, *(f"failed/{n}" for n in reward.names)}
