"""Schemas of the `model` group (conf/model/*.yaml): which network and tokenizer, built through `_target_` into a
models.hf.ModelSpec (loaded only where a service needs the weights). A pretrained model's dimensions come from its
checkpoint's config.json, so its node names only where the weights are and how to load them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from forge_exp.checks import FieldError, at_least, within
from forge_exp.choices import Attention, ModelDType
from forge_exp.models.tiny_options import TinyOptions


@dataclass
class LoraConfig:
    """model.lora: train low-rank adapters instead of every weight (LoRA, through peft: models/lora.py). The base
    stays frozen in model.dtype; only the adapters get gradients and AdamW state, only they move to the generators,
    and the reference model is the base with the adapters switched off. `pip install 'forge-exp[lora]'`."""

    rank: Optional[int] = None  # r of every adapter; null: full-parameter training
    alpha: float = 32.0  # the update is scaled by alpha / rank ("LoRA Without Regret": 32 for every rank)
    dropout: float = 0.0  # on the adapters' input; > 0 makes the trainer's logprobs noisier than the generator's
    target_modules: Optional[List[str]] = None  # null: every attention and MLP projection (q,k,v,o,gate,up,down)
    layers: Optional[List[int]] = None  # decoder layers that get adapters; null: all

    def __post_init__(self) -> None:
        if self.rank is not None:
            at_least("rank", self.rank, 1, "null trains every parameter")
        within("alpha", self.alpha, 0, float("inf"), low_open=True)
        within("dropout", self.dropout, 0, 1, high_open=True)
        if self.target_modules is not None and not self.target_modules:
            raise FieldError("target_modules", "is empty: name modules to adapt, or null for the default")
        for layer in self.layers or ():
            at_least("layers", layer, 0)


@dataclass
class ModelBase:
    _target_: str = "forge_exp.models.hf.ModelSpec"
    name: str = "model"
    path: Optional[str] = None  # local HF-format directory (a real model, a warm start, a checkpoint) or .gguf file
    # generators and the reference model; trainers keep float32 master weights (their compute dtype under
    # autocast). auto: bfloat16 on GPUs and on CPUs with native bf16, else float32 (models/precision.py)
    dtype: ModelDType = ModelDType.auto
    attn_implementation: Attention = Attention.sdpa
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)

    @property
    def needs_warm_start(self) -> bool:
        """A supervised warm start runs before RL (only a randomly initialised model has one: TinyModel)."""
        return False


@dataclass
class PretrainedModel(ModelBase):
    """A released model: model.path (an HF folder or a .gguf file, dequantized once: models/gguf.py), or
    model.hf_id in the local Hugging Face cache (never downloaded)."""

    _target_: str = "forge_exp.models.hf.Pretrained"
    hf_id: Optional[str] = None  # e.g. Qwen/Qwen3-1.7B

    def __post_init__(self) -> None:
        if not (self.path or self.hf_id):
            raise FieldError("path", "or model.hf_id must be set (a local HF-format directory, or a Hub id in the "
                                     "local cache)")


@dataclass
class WarmstartConfig:
    """Supervised steps on the task before RL, for a randomly initialised model (model=tiny without model.path)
    that could not otherwise earn any reward (a model loaded from weights starts RL as it is, so only the tiny
    model has this node). Cached by a hash of the model, the dataset and these settings: a second run loads it."""

    steps: int = 1200  # step budget (it stops earlier, at target_accuracy); 0 = no warm start
    lr: float = 1e-3
    batch_size: int = 64
    target_accuracy: Optional[float] = 0.3  # stop once this fraction of training answers is exact (leaves RL room)
    cache_dir: Optional[str] = None  # default ~/.cache/forge-exp/warmstart

    def __post_init__(self) -> None:
        at_least("steps", self.steps, 0)
        at_least("batch_size", self.batch_size, 1)
        within("lr", self.lr, 0, float("inf"), low_open=True, high_open=True)
        within("target_accuracy", self.target_accuracy, 0, 1, low_open=True, nullable=True)


@dataclass
class TinyModel(TinyOptions, ModelBase):
    """The default experiment's model: a randomly initialised tiny Qwen3 with the character tokenizer
    (models/tiny.py). With `path` set, that directory is loaded instead (its warm start, a checkpoint). Its sizes,
    their defaults and ranges: models/tiny_options.py."""

    _target_: str = "forge_exp.models.tiny.TinyQwen3"
    name: str = "tiny"
    dtype: ModelDType = ModelDType.float32
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)

    @property
    def needs_warm_start(self) -> bool:
        return self.warmstart.steps > 0 and not self.path


MODEL_SCHEMAS = {"pretrained": PretrainedModel, "tiny": TinyModel}
