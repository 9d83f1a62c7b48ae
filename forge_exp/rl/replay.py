"""Replay buffer logic: episodes wait here between rollouts and training, and leave when they are too old.

Off-policy bound: a batch trained at policy version v holds only episodes sampled by versions >= v - max_policy_age.
`state_dict()` / `load_state_dict()` carry the episodes and the sampling RNG through a checkpoint as plain JSON
(floats round-trip exactly), so a resumed run trains on the batches the interrupted one had made.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from typing import Any

from forge_exp.rl.types import Completion, Episode


class ReplayBuffer:
    def __init__(self, max_policy_age: int, seed: int = 0, capacity: int = 100_000):
        self.max_policy_age = max_policy_age
        self.capacity = capacity
        self._episodes: deque[Episode] = deque()
        self._rng = random.Random(seed)
        self.evicted = 0  # episodes dropped for age or capacity, over the buffer's life
        self._last: tuple[list[Episode], Any] | None = None  # the last sample in buffer order, the RNG before it

    def __len__(self) -> int:
        return len(self._episodes)

    def add(self, episodes: list[Episode]) -> None:
        self._episodes.extend(episodes)
        while len(self._episodes) > self.capacity:
            self._episodes.popleft()
            self.evicted += 1

    def evict(self, policy_version: int) -> int:
        """Drop episodes older than max_policy_age relative to the trainer's current version."""
        oldest = policy_version - self.max_policy_age
        kept = deque(e for e in self._episodes if e.policy_version >= oldest)
        dropped = len(self._episodes) - len(kept)
        self._episodes = kept
        self.evicted += dropped
        return dropped

    def sample(self, n: int, policy_version: int) -> list[Episode] | None:
        """Take n episodes (oldest first, so nothing waits until it expires), or None if fewer are fresh enough."""
        self.evict(policy_version)
        if len(self._episodes) < n:
            return None
        batch = [self._episodes.popleft() for _ in range(n)]
        self._last = (list(batch), self._rng.getstate())
        self._rng.shuffle(batch)
        return batch

    def unsample(self) -> int:
        """Put the last sample back as if it had never been taken (the episodes first, in their order, and the RNG as
        it was): the loop takes a step's batch while the step before trains, and a run stopped between the two
        checkpoints the buffer with it. Returns how many came back (0: nothing to undo)."""
        if self._last is None:
            return 0
        episodes, rng = self._last
        self._last = None
        self._episodes.extendleft(reversed(episodes))
        self._rng.setstate(rng)
        return len(episodes)

    def state_dict(self) -> dict[str, Any]:
        return {"episodes": [dataclasses.asdict(e) for e in self._episodes], "rng": _plain(self._rng.getstate()),
                "evicted": self.evicted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._episodes = deque(episode_from_dict(e) for e in state["episodes"])
        self._last = None
        self._rng.setstate(_tuples(state["rng"]))
        self.evicted = state["evicted"]


def episode_from_dict(d: dict[str, Any]) -> Episode:
    return Episode(**{**d, "completion": Completion(**d["completion"])})


def _plain(x: Any) -> Any:
    return [_plain(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x
