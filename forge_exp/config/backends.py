"""Schemas of the `trainer` and `generator` groups: which engine trains and which one samples. The GRPO loop never
knows which one runs; each engine is built in its service's process through `_target_`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerBackend:
    """conf/trainer/hf.yaml: one process, the whole model, transformers' modules (forge_exp/trainers/hf.py)."""

    _target_: str = "forge_exp.trainers.hf.HFTrainer"
    name: str = "hf"


@dataclass
class GeneratorBackend:
    """conf/generator/torch.yaml: the torch-native engine (forge_exp/generators/)."""

    _target_: str = "forge_exp.generators.torch_engine.TorchEngine"
    name: str = "torch"
