"""Hugging Face causal LMs and tokenizers, loaded from local files only.

This machine (and most SLURM compute nodes) cannot reach the Hub, so every load passes `local_files_only=True`:
a model comes from `model.path` (a local directory in HF format) or from the local Hugging Face cache under
`model.hf_id`. `check_model_available` answers "will the load work?" from file names alone, without loading
anything, so the CLI can fail in a second instead of after spawning the process meshes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from forge_exp.config.model import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# A model directory has one of these: a single safetensors/bin file or the index of a sharded one.
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)
# from_pretrained is not thread-safe: it builds the model under process-wide meta-device / no-init state, so two
# actors loading at once in one process (trainer and reference model colocated on a mesh) leave tied weights such
# as Qwen3's lm_head on the meta device ("Cannot copy out of meta tensor"). One load at a time per process.
_LOAD_LOCK = threading.Lock()


def load_causal_lm(
    path_or_id: str,
    dtype: str = "bfloat16",
    attn_implementation: str = "sdpa",
    gradient_checkpointing: bool = False,
) -> PreTrainedModel:
    """Load a causal LM from a local directory or the local HF cache (never the network), on CPU."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    with _LOAD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(
            path_or_id, dtype=DTYPES[dtype], attn_implementation=attn_implementation, local_files_only=True
        )
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in the backward pass. Non-reentrant, so it works when the
    inputs do not require grad (the usual RL case)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def load_tokenizer(path_or_id: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer locally; prompts are left-padded, and a tokenizer without a pad token pads with EOS."""
    tokenizer = AutoTokenizer.from_pretrained(path_or_id, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # Llama 3 ships without one; pad positions are masked anyway
    return tokenizer


def _missing_from_dir(path: str) -> str | None:
    """Why `path` is not a loadable HF model directory, or None when it is."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return "is not a directory"
    if not (p / "config.json").is_file():
        return "has no config.json"
    if not any((p / name).is_file() for name in WEIGHT_FILES):
        return "has no model.safetensors (or sharded index / pytorch_model.bin)"
    return None


def _in_hf_cache(repo_id: str) -> bool:
    """Whether config.json and the weights of `repo_id` are in the local HF cache (file lookups, no network)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> bool:
        return isinstance(try_to_load_from_cache(repo_id, name), str)

    return cached("config.json") and any(cached(name) for name in WEIGHT_FILES)


def check_model_available(cfg: "ModelConfig") -> None:
    """Raise ValueError with one line saying what to do when the weights of `cfg` are not on this machine.

    Fast: looks at file names only. A tiny model without `path` is built from scratch, so it is always available.
    """
    if cfg.path:
        why = _missing_from_dir(cfg.path)
        if why:
            raise ValueError(f"model.path={cfg.path} {why}: pass a local directory saved with save_pretrained")
        return
    if cfg.source == "tiny":
        return
    if not cfg.hf_id:
        raise ValueError("model.source=hf needs model.hf_id (a Hub id in the local cache) or model.path (a local dir)")
    if not _in_hf_cache(cfg.hf_id):
        raise ValueError(
            f"model.path is not set and {cfg.hf_id} is not in the local Hugging Face cache "
            "(this machine cannot reach the Hub): download it elsewhere and pass model.path=<local dir>"
        )
