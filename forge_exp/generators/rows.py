"""What the native engine (native.py) tracks on the host: each `generate` call (`Request`), each sequence it asked
for (`Row`), and the KV-cache slots the rows hold (`SlotPool`)."""

from __future__ import annotations

from dataclasses import dataclass

from forge_exp.generators.base import Generation, Sampling


@dataclass
class Request:
    seed: int
    sampling: Sampling
    results: list[Generation | None]
    settle: callable  # (results, error) -> None, thread-safe
    remaining: int = 0


@dataclass
class Row:
    request: Request
    index: int  # prompt_index * n + sample_index
    prompt: list[int]
    generated: int = 0  # tokens drawn, as of the last chunk read back
    queued: int = 0  # tokens it will have drawn (at most) once every chunk queued has run
    slot: int = -1
    prefix: int = -1  # the slot its prompt's K/V are read from: its own, or another sample's of the same prompt


class SlotPool:
    """The cache's slots: free ones, and how many rows use each. A row holds its own slot and the slot its prompt's
    K/V are read from (with generator.share_prompt_kv, its prompt's first sample's), so a prompt's first sample may
    finish before the samples that read its K/V without its slot being taken again."""

    def __init__(self, slots: int) -> None:
        self._free = list(range(slots - 1, -1, -1))  # taken from the end: slot 0 first
        self._holders = [0] * slots

    def __len__(self) -> int:
        """Free slots."""
        return len(self._free)

    def take(self) -> int:
        """A free slot for a new row (held once `hold` counts it)."""
        return self._free.pop()

    def hold(self, *slots: int) -> None:
        for slot in set(slots):
            self._holders[slot] += 1

    def release(self, *slots: int) -> None:
        """A row is done with `slots`; one that no row uses any more is free."""
        for slot in set(slots):
            self._holders[slot] -= 1
            if self._holders[slot] == 0:
                self._free.append(slot)

    @property
    def idle(self) -> bool:
        """Every slot free and held by no row."""
        return sorted(self._free) == list(range(len(self._holders))) and not any(self._holders)
