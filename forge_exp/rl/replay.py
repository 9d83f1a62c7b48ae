"""Replay buffer logic: episodes wait here between rollouts and training, and leave when they are too old.

Off-policy bound: a batch trained at policy version v holds only episodes sampled by versions >= v - max_policy_age.
"""

from __future__ import annotations

import random
from collections import deque

from forge_exp.rl.types import Episode


class ReplayBuffer:
    def __init__(self, max_policy_age: int, seed: int = 0, capacity: int = 100_000):
        self.max_policy_age = max_policy_age
        self.capacity = capacity
        self._episodes: deque[Episode] = deque()
        self._rng = random.Random(seed)
        self.evicted = 0  # episodes dropped for age or capacity, over the buffer's life

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
        self._rng.shuffle(batch)
        return batch
