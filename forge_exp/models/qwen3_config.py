"""The configuration of models/qwen3.py's Qwen3: the fields of transformers' Qwen3Config that the computation uses,
read from and written as transformers' config.json (4.x and 5.x field names)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class Qwen3Config:
    """The fields of transformers' Qwen3Config that the computation uses (same names, same defaults)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 40960
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    attn_implementation: str = "sdpa"  # or "eager" (softmax written out); how to run, so not in config.json
    model_type = "qwen3"  # what decoder.py and checkpoint readers look at
    hidden_act = "silu"

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> "Qwen3Config":
        """From a transformers config.json (4.x or 5.x field names); ValueError naming the field it cannot run."""
        if d.get("model_type") != "qwen3":
            raise ValueError(f"{where}: model_type is {d.get('model_type')!r}, not 'qwen3'")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"{where}: rope type {rope.get('rope_type', rope.get('type'))!r} is not supported here "
                             "(only the default rotary embedding)")
        if d.get("use_sliding_window"):
            raise ValueError(f"{where}: use_sliding_window=true is not supported here")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: hidden_act {d['hidden_act']!r} is not silu")
        names = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "attn_implementation"}
        fields = {k: v for k, v in d.items() if k in names}
        fields.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        theta = rope.get("rope_theta", d.get("rope_theta"))
        return cls(**fields, **({"rope_theta": float(theta)} if theta is not None else {}))

    def to_dict(self, dtype: torch.dtype | None = None) -> dict:
        """config.json as transformers writes it for this model (the weights' `dtype` when given; peft reads the
        rest when it wraps the model)."""
        from transformers import Qwen3Config as HFConfig  # at save time only: ~0.4 s to import

        fields = dataclasses.asdict(self)
        del fields["attn_implementation"]
        # rope_theta: 4.x's argument, which 5.x turns into its rope_parameters
        config = HFConfig(**fields, architectures=["Qwen3ForCausalLM"]).to_dict()
        if dtype is not None:
            config["dtype" if "dtype" in config else "torch_dtype"] = str(dtype).removeprefix("torch.")
        return config
