"""Tiny Qwen3-architecture causal LMs, randomly initialised, for CPU experiments and tests.

They are ordinary transformers `Qwen3ForCausalLM` models, so `save_pretrained` / `from_pretrained`, the generator,
the trainer and the checkpoint code treat them exactly like a real Qwen3 (torchtune-style builders: literal sizes
in one function per size).
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


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
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    config._attn_implementation = attn_implementation
    # Seed only the init: the caller's global RNG state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model


def qwen3_tiny(*, vocab_size: int, pad_id: int, bos_id: int, eos_id: int, seed: int = 0) -> Qwen3ForCausalLM:
    """The default experiment's model (~0.59M parameters with the character tokenizer): conf/model/tiny.yaml."""
    return qwen3(
        vocab_size=vocab_size,
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=384,
        max_position_embeddings=64,
        pad_id=pad_id,
        bos_id=bos_id,
        eos_id=eos_id,
        seed=seed,
    )
