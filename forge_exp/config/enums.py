"""From a typed config value to the plain one the pure layers take. The Enums that type config fields are
forge_exp/choices.py's (each set of choices is defined once there)."""

from __future__ import annotations

from enum import Enum


def plain(value):
    """An Enum member's value; anything else as it is (the pure layers take plain strings)."""
    return value.value if isinstance(value, Enum) else value
