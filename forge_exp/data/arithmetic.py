"""Synthetic multi-digit arithmetic: `Problem(prompt="37+48=", target="85")`.

The default experiment's task: small enough for a tiny model on CPU, with an exact reward. Every problem
`a op b` belongs to a fixed bucket given by a stable hash (blake2b, the same in every process and Python run);
bucket 0 is held out. The held-out set is drawn only from bucket 0 and the training stream rejects bucket 0, so
the two are disjoint by construction, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from forge_exp.rl.types import Problem

OPS = "+-*/"
HELDOUT_BUCKETS = 8  # 1/HELDOUT_BUCKETS of the problem space is reserved for evaluation


def max_eval_size(digits: int, ops: str) -> int:
    """The largest held-out set the problem space leaves room for (division has fewer problems: /4 leaves room)."""
    return len(ops) * 10 ** (2 * digits) // (4 * HELDOUT_BUCKETS)


@dataclass(frozen=True)
class ArithmeticTask:
    digits: int = 2  # operands are drawn uniformly from [0, 10**digits)
    ops: str = "+"  # any of "+-*/": subtraction orders its operands so results are never negative; division is
    # exact (a = b·q with b ≥ 1), so every answer is an integer
    eval_size: int = 200  # held-out problems (dataset.eval_size's default, config/dataset.py)
    seed: int = 0  # the training stream's order
    heldout_buckets: int = HELDOUT_BUCKETS
    heldout_seed: int = 1234  # fixes which bucket-0 problems form the held-out set

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
        """The fixed evaluation set: `eval_size` distinct problems, the same on every call and machine."""
        rng = random.Random(self.heldout_seed)
        seen: set[tuple[int, str, int]] = set()
        out = []
        for _ in range(1000 * self.eval_size + 100_000):
            if len(out) == self.eval_size:
                return out
            key = self._draw(rng)
            if key not in seen and self.is_heldout(*key):
                seen.add(key)
                out.append(make_problem(*key))
        if len(out) == self.eval_size:
            return out
        raise ValueError(
            f"only {len(out)} distinct held-out problems found for digits={self.digits}, ops={self.ops!r}, "
            f"eval_size={self.eval_size}: lower the held-out size (dataset.eval_size) or raise digits"
        )

    def problems(self, tokenizer=None) -> tuple[Callable[..., Iterator[Problem]], list[Problem]]:
        """(train stream factory, held-out problems), the interface every problem source has (data/hf.py)."""
        return (lambda start_epoch=0: self.train_stream()), self.heldout()

    def eval_problems(self, tokenizer=None) -> list[Problem]:
        return self.heldout()

    def train_stream(self, seed: int | None = None) -> Iterator[Problem]:
        """An endless seeded stream of training problems, never one of the held-out bucket."""
        rng = random.Random(self.seed if seed is None else seed)
        while True:
            key = self._draw(rng)
            if not self.is_heldout(*key):
                yield make_problem(*key)


def make_problem(a: int, op: str, b: int) -> Problem:
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
    question = f"{a}{op}{b}"
    return Problem(prompt=f"{question}=", target=str(value), question=question)
