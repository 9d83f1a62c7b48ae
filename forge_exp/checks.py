"""Range checks for the schemas' __post_init__ (the components' own dataclasses and those in config/). A failed
check raises FieldError naming the field; config/validate.py prefixes the node's path (`algorithm.loss` +
`clip_low` → "algorithm.loss.clip_low must be ..."). Plain Python: the pure layers check their knobs with it."""

from __future__ import annotations

import math


class FieldError(ValueError):
    def __init__(self, field: str, message: str | None = None):
        # (one argument: OmegaConf re-raises an exception type with its formatted message alone)
        super().__init__(field if message is None else f"{field} {message}")
        self.field = field if message is not None else None


def at_least(field: str, value: int | float, low: int | float, why: str = "") -> None:
    if not value >= low:
        raise FieldError(field, f"must be >= {low}{f' ({why})' if why else ''}, got {value}")


def positive(field: str, value: float, why: str = "") -> None:
    if not value > 0:
        raise FieldError(field, f"must be > 0{f' ({why})' if why else ''}, got {value}")


def finite(field: str, value: float) -> None:
    if not math.isfinite(value):
        raise FieldError(field, f"must be finite, got {value}")


def within(field: str, value: float | None, low: float, high: float, *, low_open=False, high_open=False,
           nullable=False) -> None:
    """low <= value <= high (open ends as asked); None only when nullable."""
    if value is None and nullable:
        return
    ok = value is not None and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise FieldError(field, f"must be in {interval}{' or null' if nullable else ''}, got {value}")


MAX_SEED = 2**63 - 1  # torch.manual_seed and numpy take at most 64 bits; a larger int fails in a service


def seed(field: str, value: int) -> None:
    within(field, value, 0, MAX_SEED)


def not_empty(field: str, value: str | None, example: str = "") -> None:
    if not value:
        raise FieldError(field, f"must be set{f' (e.g. {example})' if example else ''}")
