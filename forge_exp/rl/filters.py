"""Group filters and length shaping from DAPO (Yu et al. 2025, arXiv 2503.14476). Pure: no I/O.

- Dynamic sampling (§3.2): keep only groups whose rewards are not all equal (0 < #correct < G for 0/1 rewards);
  a zero-variance group has all-zero advantages and contributes no gradient. `DynamicSampling` is the small
  state machine the loop uses to count them and to refill the batch, with a cap on generation rounds.
- Overlong filtering (§3.4): truncated completions (stop_reason == "length") get no loss: a per-row keep mask.
- Soft overlong punishment (§3.4, eq. 13): a length-dependent penalty added to the reward.

Departure: the paper keeps sampling until the batch is full; here the loop stops after `max_attempts` rounds
and trains on the groups it has (`exhausted` says so), so a task the model cannot yet solve does not hang.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from forge_exp.rl.types import Completion, Episode, Group, TrainBatch


# ---------------------------------------------------------------------------------------------- dynamic sampling
def _rewards(x: Group | torch.Tensor | Sequence[float]) -> list[float]:
    if isinstance(x, Group):
        return list(x.rewards)
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def is_zero_variance(rewards: Group | torch.Tensor | Sequence[float]) -> bool:
    """True when every reward of the group is equal (so every group-relative advantage is 0)."""
    r = _rewards(rewards)
    if not r:
        raise ValueError("is_zero_variance: the group has no rewards (score it before filtering)")
    return max(r) == min(r)


def has_mixed_rewards(group: Group) -> bool:
    """The dynamic-sampling predicate: keep the group only if its rewards differ."""
    return not is_zero_variance(group)


def count_zero_variance(groups: Iterable[Group]) -> int:
    return sum(is_zero_variance(g) for g in groups)


@dataclass
class DynamicSampling:
    """Collect `target` groups per step, dropping zero-variance ones when `enabled`.

        sampler = DynamicSampling(target=cfg.prompts_per_step, max_attempts=cfg.max_sampling_attempts,
                                  enabled=cfg.dynamic_sampling)
        while not sampler.done:
            sampler.add(await rollout(n_prompts=sampler.needed))
        groups, metrics = sampler.take(), sampler.metrics()

    Disabled, it keeps every group after one round and only counts the zero-variance ones.
    """

    target: int
    max_attempts: int = 1
    enabled: bool = True
    kept: list[Group] = field(default_factory=list)
    attempts: int = 0
    seen: int = 0
    zero_variance: int = 0

    def __post_init__(self) -> None:
        if self.target < 1:
            raise ValueError(f"DynamicSampling.target must be >= 1, got {self.target}")
        if self.max_attempts < 1:
            raise ValueError(f"algorithm.max_sampling_attempts must be >= 1, got {self.max_attempts}")

    @property
    def needed(self) -> int:
        """Groups still missing."""
        return max(self.target - len(self.kept), 0)

    @property
    def exhausted(self) -> bool:
        """Out of attempts with the batch still short."""
        return self.needed > 0 and self.attempts >= self.max_attempts

    @property
    def done(self) -> bool:
        if not self.enabled:
            return self.attempts >= 1
        return self.needed == 0 or self.attempts >= self.max_attempts

    def add(self, groups: Iterable[Group]) -> None:
        """Record one generation round."""
        self.attempts += 1
        for g in groups:
            self.seen += 1
            zero = is_zero_variance(g)
            self.zero_variance += zero
            if not (self.enabled and zero):
                self.kept.append(g)

    def take(self) -> list[Group]:
        """The kept groups, at most `target` (extra groups of the last round are dropped)."""
        return self.kept[: self.target]

    def top_up(self, seen: list[Group]) -> list[Group]:
        """Exhausted: the dropped groups of `seen` (every group of every round) that fill the batch, rather than a
        stalled run (zero advantage: they add no gradient); [] otherwise."""
        if not self.exhausted:
            return []
        kept = {id(g) for g in self.take()}
        return [g for g in seen if id(g) not in kept][: self.needed]

    def metrics(self) -> dict[str, float]:
        return {
            "filter/groups_seen": float(self.seen),
            "filter/zero_variance_groups": float(self.zero_variance),
            "filter/zero_variance_frac": self.zero_variance / max(self.seen, 1),
            "filter/groups_kept": float(len(self.take())),
            "filter/sampling_attempts": float(self.attempts),
            "filter/sampling_exhausted": float(self.exhausted),
        }


# ---------------------------------------------------------------------------------------------- overlong
def overlong_keep_mask(
    x: TrainBatch | torch.Tensor | Sequence[Completion | Episode],
) -> torch.Tensor:
    """[B] bool, False on completions truncated at the length limit (overlong filtering)."""
    if isinstance(x, TrainBatch):
        truncated = x.truncated
    elif isinstance(x, torch.Tensor):
        truncated = x
    else:
        comps = [c.completion if isinstance(c, Episode) else c for c in x]
        truncated = torch.tensor([c.truncated for c in comps], dtype=torch.bool)
    if truncated.dim() != 1:
        raise ValueError(f"overlong_keep_mask expects one flag per completion [B], got shape {list(truncated.shape)}")
    return ~truncated.bool()


def mask_rows(padding_mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zero the response mask of rows not kept: they then contribute nothing to any built-in loss."""
    # padding_mask: [B, T], keep: [B] bool
    return padding_mask & keep.unsqueeze(-1) if padding_mask.dtype == torch.bool else padding_mask * keep.unsqueeze(-1)


def soft_overlong_penalty(
    length: int | torch.Tensor, max_len: int, buffer_len: int
) -> float | torch.Tensor:
    """DAPO eq. 13, with L_max = max_len and L_cache = buffer_len:

        0                                    |y| ≤ L_max − L_cache
        ((L_max − L_cache) − |y|) / L_cache  L_max − L_cache < |y| ≤ L_max     (linear from 0 down to −1)
        −1                                   L_max < |y|
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"algorithm.overlong_buffer must be in [1, max_response_len={max_len}], got {buffer_len}")
    start = max_len - buffer_len
    if isinstance(length, torch.Tensor):
        inside = (start - length.to(torch.float32)) / buffer_len
        ramp_or_cliff = torch.where(length <= max_len, inside, -torch.ones_like(inside))
        return torch.where(length <= start, torch.zeros_like(inside), ramp_or_cliff)
    if length <= start:
        return 0.0
    return (start - length) / buffer_len if length <= max_len else -1.0


def apply_soft_overlong_penalty(group: Group, max_len: int, buffer_len: int) -> Group:
    """A copy of the group with each reward shifted by the soft overlong penalty of its completion's length."""
    if len(group.rewards) != len(group.completions):
        n, m = len(group.completions), len(group.rewards)
        raise ValueError(f"group has {n} completions but {m} rewards; score it first")
    penalties = [soft_overlong_penalty(len(c.token_ids), max_len, buffer_len) for c in group.completions]
    rewards = [r + p for r, p in zip(group.rewards, penalties)]
    return dataclasses.replace(group, rewards=rewards)
