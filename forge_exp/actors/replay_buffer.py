"""Replay buffer service: a thin actor around rl.replay.ReplayBuffer."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_exp.rl.replay import ReplayBuffer
from forge_exp.rl.types import Episode


class ReplayBufferService(Actor):
    def __init__(self, max_policy_age: int, seed: int, *, devices, threads):
        self.buffer = ReplayBuffer(max_policy_age=max_policy_age, seed=seed)

    @endpoint
    async def add(self, episodes: list[Episode]) -> int:
        self.buffer.add(episodes)
        return len(self.buffer)

    @endpoint
    async def sample(self, n: int, policy_version: int) -> list[Episode] | None:
        return self.buffer.sample(n, policy_version)

    @endpoint
    async def unsample(self) -> int:
        return self.buffer.unsample()

    @endpoint
    async def state(self) -> dict:
        """The episodes waiting and the sampling RNG, for a checkpoint (rl/replay.py)."""
        return self.buffer.state_dict()

    @endpoint
    async def restore(self, state: dict) -> None:
        self.buffer.load_state_dict(state)

    @endpoint
    async def stats(self) -> dict[str, float]:
        return {"buffer/size": len(self.buffer), "buffer/evicted": self.buffer.evicted}
