"""Scored groups → Episodes: reward shaping, group-relative advantages, one Episode per completion."""

from __future__ import annotations

from forge_exp.rl.advantages import compute_advantages
from forge_exp.rl.filters import apply_soft_overlong_penalty
from forge_exp.rl.types import Episode, Group


def to_episodes(
    groups: list[Group], advantage: str, eps: float, overlong_penalty: bool, max_len: int, overlong_buffer: int
) -> list[Episode]:
    episodes = []
    for group in groups:
        if overlong_penalty:  # DAPO's soft punishment of responses close to the length limit
            group = apply_soft_overlong_penalty(group, max_len, overlong_buffer)
        advantages = compute_advantages(group.rewards, str(getattr(advantage, "value", advantage)), eps=eps)
        episodes += [
            Episode(completion=c, reward=r, advantage=float(a))
            for c, r, a in zip(group.completions, group.rewards, advantages)
        ]
    return episodes
