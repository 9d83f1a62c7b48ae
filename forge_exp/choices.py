"""Every set of named choices a config field can take, defined once. The pure layers dispatch on these names
(rl/kl.py, rl/advantages.py, ...), the schemas in config/ type their fields with them; nothing heavy is imported
here, so the CLI can check a config before torch loads.

Each tuple also has an Enum (below) that typed config fields use, so OmegaConf rejects a wrong choice and names the
allowed ones. Its members are str: `KLEstimator.k3 == "k3"`, so code that dispatches on the plain names takes either.
"""

from enum import Enum

KL_ESTIMATORS = ("k1", "k2", "k3")  # rl/kl.py (Schulman 2020)
LOSS_AGGREGATIONS = ("token_mean", "seq_mean", "fixed_horizon")  # rl/losses/primitives.py
ADVANTAGES = ("group_norm", "mean", "loo")  # rl/advantages.py
# rl/losses/correction.py: how a loss corrects for the generator/trainer mismatch, and each mode's cap C when
# algorithm.loss.rollout_cap is null (tis, mis: verl's and Yao et al.'s 2; seq_mask: verl's geometric 1.001)
ROLLOUT_CORRECTIONS = ("none", "tis", "mis", "seq_mask")
DEFAULT_ROLLOUT_CAP = {"tis": 2.0, "mis": 2.0, "seq_mask": 1.001}
TARGET_FORMATS = ("gsm8k", "boxed", "raw")  # data/hf.py: extract_target
BAD_ROWS = ("fail", "skip")  # data/hf.py: BadRows, what a data row that fails its check does
DTYPES = ("float32", "bfloat16", "float16")  # models/hf.py
MODEL_DTYPES = ("auto", *DTYPES)  # model.dtype: auto is bfloat16 where it is native, else float32 (models/precision.py)
ATTENTION = ("sdpa", "eager")  # transformers attn_implementation
INFLIGHT_UPDATES = ("keep", "wait")  # generators/vllm.py: requests in flight when new weights arrive
PARALLELISMS = ("single", "fsdp", "tp", "fsdp_tp")  # trainers/parallel.py: how the trainer shards its model
ACTIVATION_CHECKPOINTING = ("none", "full", "selective")  # trainers/titan.py (TorchTitan's AC modes)
ATTENTION_BACKENDS = ("sdpa", "flex")  # trainers/titan.py
CHAT_FORMATS = ("tiny", "qwen3", "llama3")  # envs/formats.py: how turns and tool calls are written

# The tiny model's character tokenizer (models/tokenizer.py): digits, the arithmetic task's operators and a space.
# Kept minimal on purpose: every extra token is mass the untrained model spreads over useless outputs. A task with
# new characters appends them (appending keeps the ids of existing characters, so old checkpoints still decode).
ALPHABET = "0123456789+-*/= "
# The tool-using tiny model's extra characters (envs/formats.py, TinyToolFormat): `[expr]` is a calculator call,
# `(result)` the tool's reply, `?` an error. Kept out of ALPHABET so the default experiment's vocabulary stays.
TOOL_ALPHABET = ALPHABET + "[]()?"


def _enum(name: str, values: tuple[str, ...]) -> type[Enum]:
    # member names are the values (OmegaConf matches YAML strings by name); bound in this module so members pickle
    return Enum(name, {v: v for v in values}, type=str, module=__name__)


KLEstimator = _enum("KLEstimator", KL_ESTIMATORS)
LossAgg = _enum("LossAgg", LOSS_AGGREGATIONS)
Advantage = _enum("Advantage", ADVANTAGES)
RolloutCorrection = _enum("RolloutCorrection", ROLLOUT_CORRECTIONS)
TargetFormat = _enum("TargetFormat", TARGET_FORMATS)
BadRows = _enum("BadRows", BAD_ROWS)
DType = _enum("DType", DTYPES)
ModelDType = _enum("ModelDType", MODEL_DTYPES)
Attention = _enum("Attention", ATTENTION)
InflightUpdate = _enum("InflightUpdate", INFLIGHT_UPDATES)
Parallelism = _enum("Parallelism", PARALLELISMS)
Checkpointing = _enum("Checkpointing", ACTIVATION_CHECKPOINTING)
AttentionBackend = _enum("AttentionBackend", ATTENTION_BACKENDS)
ChatFormat = _enum("ChatFormat", CHAT_FORMATS)
