"""Reward functions: plain callables `fn(prompt, response, target) -> float`, combined with weights.

    build_reward(cfg.reward.functions, cfg.reward.failure_value) -> WeightedReward
    score_group(reward, problem, responses) -> (totals, components, failures)   # what the reward worker calls

Built-in functions (also reachable as `_target_: math | thinking | format`): MathReward, ThinkingReward,
FormatReward. Any class or function with the same call signature plugs in through `_target_`.
"""

from forge_exp.rewards.combine import SHORT_NAMES, RewardFn, WeightedReward, build_reward, check_spec, score_group
from forge_exp.rewards.format import FormatReward
from forge_exp.rewards.math import MathReward
from forge_exp.rewards.thinking import ThinkingReward

__all__ = [
    "SHORT_NAMES",
    "FormatReward",
    "MathReward",
    "RewardFn",
    "ThinkingReward",
    "WeightedReward",
    "build_reward",
    "check_spec",
    "score_group",
]
