"""The tiny model's sizes, torch-free: their one home, with their defaults and range checks. conf/model/tiny.yaml's
schema (config/model.py: TinyModel) is built on this dataclass, and models/tiny.py's TinyQwen3 takes its defaults
from it, so `model=tiny` and a `TinyQwen3()` in a script or a test are the same model."""

from __future__ import annotations

from dataclasses import dataclass

from forge_exp import choices
from forge_exp.checks import FieldError, at_least, seed as check_seed


@dataclass
class TinyOptions:
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 64
    seed: int = 0  # of the random initialisation
    alphabet: str = choices.ALPHABET  # the character tokenizer's characters (choices.TOOL_ALPHABET for tool use)

    def __post_init__(self) -> None:
        check_sizes(self)


def check_sizes(sizes) -> None:
    """The range checks of TinyOptions' fields, on anything that has them (a TinyQwen3 too)."""
    for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                "max_position_embeddings"):
        at_least(key, getattr(sizes, key), 1)
    check_seed("seed", sizes.seed)
    if sizes.num_heads % sizes.num_kv_heads:
        raise FieldError("num_heads", f"({sizes.num_heads}) must be a multiple of model.num_kv_heads "
                                      f"({sizes.num_kv_heads})")
    if sizes.head_dim % 2:
        raise FieldError("head_dim", f"must be even (rotary embeddings), got {sizes.head_dim}")
