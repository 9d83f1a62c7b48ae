"""Reward workers: score every completion of a group with the configured (weighted) reward functions."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_exp.config.reward import RewardConfig
from forge_exp.rewards.combine import score_group
from forge_exp.rl.types import Group
from forge_exp.runtime.build import build_reward


class RewardWorker(Actor):
    def __init__(self, reward: RewardConfig, *, devices, threads):
        self.reward = build_reward(reward)
        self.accuracy_from = self.reward.names[0]  # by convention the first function listed checks correctness

    @endpoint
    async def score(self, groups: list[Group]) -> list[Group]:
        """Fill each group's rewards, components (unweighted values by function name), correct and failures."""
        for group in groups:
            rewards, components, failures = score_group(
                self.reward, group.problem, [c.text for c in group.completions]
            )
            group.rewards = rewards
            group.components = components
            group.correct = [c[self.accuracy_from] >= 1.0 for c in components]
            group.reward_failures = failures
        return groups

    @endpoint
    async def errors(self) -> dict[str, str]:
        """Each reward function's latest failure (what a run stopped for a failing reward reports)."""
        return dict(self.reward.last_errors)
