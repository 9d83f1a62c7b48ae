"""Config enumerations, made from forge_exp/choices.py (each set of choices is defined once there); the schemas
type their fields with these so OmegaConf rejects a wrong choice, naming the allowed ones."""

from __future__ import annotations

from enum import Enum

from forge_exp import choices


def _enum(name: str, values: tuple[str, ...]) -> type[Enum]:
    # member names are the values (OmegaConf matches YAML strings by name); bound in this module so members pickle
    return Enum(name, {v: v for v in values}, type=str, module=__name__)


KLEstimator = _enum("KLEstimator", choices.KL_ESTIMATORS)
LossAgg = _enum("LossAgg", choices.LOSS_AGGREGATIONS)
Advantage = _enum("Advantage", choices.ADVANTAGES)
RolloutCorrection = _enum("RolloutCorrection", choices.ROLLOUT_CORRECTIONS)
TargetFormat = _enum("TargetFormat", choices.TARGET_FORMATS)
BadRows = _enum("BadRows", choices.BAD_ROWS)
DType = _enum("DType", choices.DTYPES)
ModelDType = _enum("ModelDType", choices.MODEL_DTYPES)
Attention = _enum("Attention", choices.ATTENTION)
InflightUpdate = _enum("InflightUpdate", choices.INFLIGHT_UPDATES)
Parallelism = _enum("Parallelism", choices.PARALLELISMS)
Checkpointing = _enum("Checkpointing", choices.ACTIVATION_CHECKPOINTING)
AttentionBackend = _enum("AttentionBackend", choices.ATTENTION_BACKENDS)
ChatFormat = _enum("ChatFormat", choices.CHAT_FORMATS)


def plain(value):
    """An Enum member's value; anything else as it is (the pure layers take plain strings)."""
    return value.value if isinstance(value, Enum) else value
