"""Scored groups → Episodes, step by step (apps/grpo.py calls each): reward shaping (DAPO's soft overlong
punishment), group-relative advantages, one Episode per completion."""

from __future__ import annotations

from forge_exp.rl.advantages import compute_advantages
from forge_exp.rl.filters import apply_soft_overlong_penalty
from forge_exp.rl.types import Episode, Group


def penalize_overlong(groups: list[Group], max_len: int, buffer_len: int) -> list[Group]:
    """DAPO's soft punishment of responses close to the length limit, added to each reward (rl/filters.py)."""
    return [apply_soft_overlong_penalty(g, max_len, buffer_len) for g in groups]


def group_advantages(groups: list[Group], advantage, eps: float) -> list[list[float]]:
    """Each group's advantages (rl/advantages.py: group_norm | mean | loo), in its completions' order."""
    method = str(getattr(advantage, "value", advantage))
    return [compute_advantages(g.rewards, method, eps=eps).tolist() for g in groups]


def to_episodes(groups: list[Group], advantages: list[list[float]]) -> list[Episode]:
    """One Episode per completion, with its reward and advantage."""
    return [Episode(completion=c, reward=r, advantage=float(a))
            for g, adv in zip(groups, advantages) for c, r, a in zip(g.completions, g.rewards, adv)]
