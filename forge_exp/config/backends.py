"""Schemas of the `trainer` and `generator` groups: which engine trains and which one samples. The GRPO loop never
knows which one runs; each engine is built in its service's process through `_target_`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from forge_exp.config.checks import at_least


@dataclass
class TrainerBackend:
    """conf/trainer/hf.yaml: one process, the whole model, transformers' modules (forge_exp/trainers/hf.py)."""

    _target_: str = "forge_exp.trainers.hf.HFTrainer"
    name: str = "hf"


@dataclass
class GeneratorBackend:
    _target_: str = "forge_exp.generators.native.NativeEngine"
    name: str = "torch"


@dataclass
class TorchGenerator(GeneratorBackend):
    """conf/generator/torch.yaml: the torch-native engine (generators/native.py): a static KV cache of `slots` rows,
    continuous batching, decode steps as CUDA graphs on GPU. KV memory: 2 × layers × (slots + 1) × max_len ×
    kv_heads × head_dim × dtype bytes."""

    slots: Optional[int] = None  # rows decoded together; null: the rows of the batches that may be in flight
    max_len: Optional[int] = None  # prompt + new tokens per row; null: the dataset's prompt budget + max_new_tokens
    sync_every: Optional[int] = None  # decode steps between host checks for finished rows; null: 16 on GPU, 1 on CPU
    cuda_graphs: bool = True  # capture decode steps as CUDA graphs (GPU only)
    prefill_tokens: int = 8192  # prompt tokens per prefill forward (bounds its activation memory)
    eos_token_ids: Optional[List[int]] = None  # null: the tokenizer's EOS and the model's generation_config EOS

    def __post_init__(self) -> None:
        for key in ("slots", "max_len", "sync_every"):
            if getattr(self, key) is not None:
                at_least(key, getattr(self, key), 1)
        at_least("prefill_tokens", self.prefill_tokens, 1)
