"""Tiny Qwen3-architecture causal LMs, randomly initialised, for CPU experiments and tests.

They are models/qwen3.py's Qwen3ForCausalLM: plain torch with transformers' parameter names and checkpoint format,
so a process that runs one imports no transformers modeling code (~1.5 s of every process's start-up), and what it
saves loads with `AutoModelForCausalLM.from_pretrained` like a real Qwen3's checkpoint (torchtune-style builders:
literal sizes in one function per size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from forge_exp.models.hf import DTYPES, ModelSpec, enable_activation_checkpointing
from forge_exp.models.qwen3 import Qwen3ForCausalLM
from forge_exp.models.qwen3_config import Qwen3Config
from forge_exp.models.tiny_options import TinyOptions, check_sizes
from forge_exp.models.tokenizer import build_char_tokenizer, load_char_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def qwen3(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    max_position_embeddings: int,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    seed: int,
    attn_implementation: str = "sdpa",
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3ForCausalLM (float32, tied embeddings) from the given sizes and seed."""
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        attn_implementation=attn_implementation,
    )
    # Seed only the init: the caller's global RNG state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model


@dataclass(frozen=True)
class TinyQwen3(ModelSpec):
    """conf/model/tiny.yaml: a randomly initialised Qwen3 with the character tokenizer, the default experiment's
    model (~0.59M parameters at these sizes). With `path` set it loads that directory instead (its warm start or a
    checkpoint), sizes and tokenizer included."""

    # the sizes: their defaults and range checks are models/tiny_options.py's (the `model=tiny` schema)
    hidden_size: int = TinyOptions.hidden_size
    num_layers: int = TinyOptions.num_layers
    num_heads: int = TinyOptions.num_heads
    num_kv_heads: int = TinyOptions.num_kv_heads
    head_dim: int = TinyOptions.head_dim
    intermediate_size: int = TinyOptions.intermediate_size
    max_position_embeddings: int = TinyOptions.max_position_embeddings
    seed: int = TinyOptions.seed
    alphabet: str = TinyOptions.alphabet

    def __post_init__(self) -> None:
        super().__post_init__()
        check_sizes(self)

    @property
    def random_init(self) -> bool:
        return self.path is None

    def check_available(self) -> None:
        if self.path:
            super().check_available()

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return load_char_tokenizer(self.path) if self.path else build_char_tokenizer(self.alphabet)

    def skeleton(self) -> Qwen3ForCausalLM:
        return self._load("cpu", None)  # ~0.6M parameters: built for real

    def _load(self, device: str | torch.device, dtype: str | None) -> Qwen3ForCausalLM:
        if self.path:
            model = Qwen3ForCausalLM.from_pretrained(self.path, DTYPES[dtype or self.dtype], self.attn_implementation)
        else:
            model = self._fresh().to(DTYPES[dtype or self.dtype])
        if self.gradient_checkpointing:
            enable_activation_checkpointing(model)
        return model.to(device)

    def _fresh(self) -> Qwen3ForCausalLM:
        tokenizer = build_char_tokenizer(self.alphabet)
        return qwen3(
            vocab_size=len(tokenizer), hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, max_position_embeddings=self.max_position_embeddings,
            pad_id=tokenizer.pad_token_id, bos_id=tokenizer.bos_token_id, eos_id=tokenizer.eos_token_id,
            seed=self.seed, attn_implementation=self.attn_implementation,
        )
