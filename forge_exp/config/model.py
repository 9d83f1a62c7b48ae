"""Schema of the `model` config group (conf/model/*.yaml) and the one entry that builds a model from it.

`source: tiny` builds a randomly initialised tiny Qwen3 with the character tokenizer (the architecture fields below
apply); `source: hf` loads `hf_id` from the local Hugging Face cache (the architecture fields are ignored).
With `path` set, either source loads that local HF-format directory instead — a warm-start checkpoint of the tiny
model, or a real model downloaded elsewhere.
"""

from dataclasses import dataclass
from typing import Optional

import torch

SOURCES = ("tiny", "hf")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass
class ModelConfig:
    name: str = "tiny"
    source: str = "tiny"  # "tiny" | "hf" (hf needs hf_id or path: checked with the weights, by check_model_available)
    hf_id: Optional[str] = None  # Hub id looked up in the local HF cache, e.g. Qwen/Qwen3-1.7B
    path: Optional[str] = None  # local HF-format directory; wins over hf_id and over building a tiny model
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    # Tiny architecture (source=tiny only). Defaults are the default experiment's model.
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        _one_of("source", self.source, SOURCES)
        _one_of("dtype", self.dtype, DTYPE_NAMES)
        _one_of("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                    "max_position_embeddings"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{key} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads ({self.num_heads}) must be a multiple of model.num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even (rotary embeddings), got {self.head_dim}")


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"model.{key} must be one of {', '.join(allowed)}, got {value!r}")


def build_tokenizer(cfg: ModelConfig):
    """The tokenizer alone (for services that format prompts but hold no model)."""
    from forge_exp.models.hf import load_tokenizer
    from forge_exp.models.tokenizer import build_char_tokenizer

    if cfg.path or cfg.source == "hf":
        return load_tokenizer(cfg.path or cfg.hf_id)
    return build_char_tokenizer()


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu"):
    """Build `(model, tokenizer)` from the config, on `device`. Loads only local files (see models/hf.py)."""
    from forge_exp.models.hf import DTYPES, enable_activation_checkpointing, load_causal_lm
    from forge_exp.models.tiny import qwen3

    tokenizer = build_tokenizer(cfg)
    if cfg.path or cfg.source == "hf":
        model = load_causal_lm(cfg.path or cfg.hf_id, cfg.dtype, cfg.attn_implementation, cfg.gradient_checkpointing)
    else:
        model = qwen3(
            vocab_size=len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings,
            pad_id=tokenizer.pad_token_id,
            bos_id=tokenizer.bos_token_id,
            eos_id=tokenizer.eos_token_id,
            seed=cfg.seed,
            attn_implementation=cfg.attn_implementation,
        ).to(DTYPES[cfg.dtype])
        if cfg.gradient_checkpointing:
            enable_activation_checkpointing(model)
    return model.to(device), tokenizer
