"""Synthetic multi-digit arithmetic: `Problem(prompt="37+48=", target="85")`.

The default experiment's task: small enough for a tiny model on CPU, with an exact reward. Every problem
`a op b` belongs to a fixed bucket given by a stable hash (blake2b, the same in every process and Python run);
bucket 0 is held out. The held-out set is drawn only from bucket 0 and the training stream rejects bucket 0, so
the two are disjoint by construction, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass

from forge_exp.rl.types import Problem

OPS = "+-*/"


@dataclass(frozen=True)
class ArithmeticTask:
    digits: int = 2  # operands are drawn uniformly from [0, 10**digits)
    ops: str = "+"  # any of "+-*/": subtraction orders its operands so results are never negative; division is
    # exact (a = b·q with b ≥ 1), so every answer is an integer
    heldout_size: int = 256
    heldout_buckets: int = 8  # 1/heldout_buckets of the problem space is reserved for evaluation
    heldout_seed: int = 1234  # fixes which bucket-0 problems form the held-out set

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 18:
            raise ValueError(f"digits must be in 1..18, got {self.digits}")
        if not self.ops or any(op not in OPS for op in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops must be distinct characters of {OPS!r}, got {self.ops!r}")
        if self.heldout_buckets < 2:
            raise ValueError(f"heldout_buckets must be >= 2, got {self.heldout_buckets}")
        space = len(self.ops) * 10 ** (2 * self.digits)  # division has fewer problems: the /4 below leaves room
        if not 0 <= self.heldout_size <= space // (4 * self.heldout_buckets):
            raise ValueError(
                f"heldout_size must be in 0..{space // (4 * self.heldout_buckets)} for digits={self.digits}, "
                f"ops={self.ops!r}, got {self.heldout_size}"
            )

    def is_heldout(self, a: int, op: str, b: int) -> bool:
        digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.heldout_buckets == 0

    def _draw(self, rng: random.Random) -> tuple[int, str, int]:
        high = 10**self.digits - 1
        op = rng.choice(self.ops)
        if op == "/":
            b = rng.randint(1, high)
            return b * rng.randint(0, high // b), op, b
        a, b = rng.randint(0, high), rng.randint(0, high)
        if op == "-" and b > a:
            a, b = b, a
        return a, op, b

    def heldout(self) -> list[Problem]:
        """The fixed evaluation set: `heldout_size` distinct problems, the same on every call and machine."""
        rng = random.Random(self.heldout_seed)
        seen: set[tuple[int, str, int]] = set()
        out = []
        for _ in range(1000 * self.heldout_size + 100_000):
            if len(out) == self.heldout_size:
                return out
            key = self._draw(rng)
            if key not in seen and self.is_heldout(*key):
                seen.add(key)
                out.append(make_problem(*key))
        if len(out) == self.heldout_size:
            return out
        raise ValueError(
            f"only {len(out)} distinct held-out problems found for digits={self.digits}, ops={self.ops!r}, "
            f"heldout_size={self.heldout_size}: lower the held-out size (dataset.eval_size) or raise digits"
        )

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """An endless seeded stream of training problems, never one of the held-out bucket."""
        rng = random.Random(seed)
        while True:
            key = self._draw(rng)
            if not self.is_heldout(*key):
                yield make_problem(*key)


def make_problem(a: int, op: str, b: int) -> Problem:
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
    question = f"{a}{op}{b}"
    return Problem(prompt=f"{question}=", target=str(value), question=question)
