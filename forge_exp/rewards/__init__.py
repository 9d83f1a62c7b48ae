"""Reward functions: plain callables `fn(prompt, response, target) -> float`, combined with weights.

    WeightedReward({name: (fn, weight)}, failure_value)                  # forge_exp.runtime.build.build_reward
    score_group(reward, problem, responses) -> (totals, components, failures)   # what the reward worker calls

Built-in functions: MathReward, ThinkingReward, FormatReward. Any class or function with the same call signature
plugs in through `_target_`.
"""

from forge_exp.rewards.combine import RewardFn, WeightedReward, score_group
from forge_exp.rewards.format import FormatReward
from forge_exp.rewards.math import MathReward
from forge_exp.rewards.thinking import ThinkingReward

__all__ = ["FormatReward", "MathReward", "RewardFn", "ThinkingReward", "WeightedReward", "score_group"]
