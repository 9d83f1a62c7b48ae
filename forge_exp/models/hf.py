"""Hugging Face causal LMs and tokenizers, loaded from local files only.

This machine (and most SLURM compute nodes) cannot reach the Hub, so every load passes `local_files_only=True`:
a model comes from `model.path` (a local directory in HF format) or from the local Hugging Face cache under
`model.hf_id`. A `ModelSpec` (what conf/model/*.yaml builds) says which model and how to load it, without loading
it: `check_available()` answers "will the load work?" from file names alone, so the CLI can fail in a second
instead of after spawning the process meshes; `build()` and `tokenizer()` load.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from forge_exp import choices
from forge_exp.models.lora import Lora, adapter_base, is_adapter_dir, merge_adapter
from forge_exp.models.precision import auto_dtype

if TYPE_CHECKING:  # transformers' modeling code is imported by the loaders below, not here: a process that only
    # needs a tokenizer (the dataset service) or a ModelSpec (the CLI's preflight) saves ~2.5 s and ~150 MiB
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {name: getattr(torch, name) for name in choices.DTYPES}
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
    from transformers import AutoModelForCausalLM

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
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path_or_id, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # Llama 3 ships without one; pad positions are masked anyway
    return tokenizer


def _missing_from_dir(path: str) -> str | None:
    """Why `path` is not a loadable HF model directory, or None when it is: from the files' names, config.json and
    the safetensors headers (a file cut short by a copy shows there), without reading the weights."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return "is not a directory"
    if not (p / "config.json").is_file():
        return "has no config.json"
    try:
        config = json.loads((p / "config.json").read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError included
        return f"has a config.json that is not JSON ({e})"
    if not isinstance(config, dict):
        return f"has a config.json that is not a JSON object (a {type(config).__name__})"
    if not any((p / name).is_file() for name in WEIGHT_FILES):
        return "has no model.safetensors (or sharded index / pytorch_model.bin)"
    shards = ["model.safetensors"] if (p / "model.safetensors").is_file() else []
    if not shards and (p / "model.safetensors.index.json").is_file():
        try:
            shards = sorted(set(json.loads((p / "model.safetensors.index.json").read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"has a model.safetensors.index.json without a readable weight_map ({type(e).__name__}: {e})"
    for name in shards:
        if why := safetensors_problem(p / name):
            return why
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at `path` cannot be loaded whole, from its header alone (8 bytes of length, a JSON
    table of tensors and their byte ranges), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or 8 + length > size:
                return (f"has a {path.name} of {size} bytes, too short for its own header (cut short, or not "
                        f"safetensors)")
            table = json.loads(f.read(length))
        end = max((int(t["data_offsets"][1]) for k, t in table.items() if k != "__metadata__"), default=0)
    except FileNotFoundError:
        return f"has no {path.name} (named in model.safetensors.index.json)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        return f"has a {path.name} that is not safetensors ({type(e).__name__}: {e})"
    if 8 + length + end != size:
        return f"has a {path.name} of {size} bytes where its header says {8 + length + end} (cut short by a copy?)"
    return None


def _in_hf_cache(repo_id: str) -> bool:
    """Whether config.json and the weights of `repo_id` are in the local HF cache (file lookups, no network)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> bool:
        return isinstance(try_to_load_from_cache(repo_id, name), str)

    return cached("config.json") and any(cached(name) for name in WEIGHT_FILES)


@dataclass(frozen=True)
class ModelSpec:
    """A model to load from a local HF-format directory (`path`). Subclasses say where else it may come from."""

    path: str | None = None  # a local HF-format directory: a real model, a warm start or a checkpoint
    dtype: str = "float32"  # what generators and the reference model hold; trainers keep float32 master weights
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    lora: dict | None = None  # model.lora (config/model.py: LoraConfig); rank null: full-parameter training
    # a LoRA checkpoint to merge into the base (models/lora.py): set when `path` is an adapter directory, whose
    # base (its base_model_name_or_path) then becomes `path`
    adapter: str | None = None

    def __post_init__(self) -> None:
        if self.dtype == "auto":  # built outside a run (a script, a test): the CLI decides it once for a run
            object.__setattr__(self, "dtype", auto_dtype(torch.cuda.is_available())[0])
        if self.lora is not None and self.lora.get("rank") is None:  # model.lora.rank=null: no adapters
            object.__setattr__(self, "lora", None)
        if self.adapter is None and is_adapter_dir(self.path):
            base = adapter_base(self.path)
            object.__setattr__(self, "adapter", self.path)
            object.__setattr__(self, "path", base if base and Path(base).expanduser().is_dir() else None)

    @property
    def lora_spec(self):
        """The adapters to train (models.lora.Lora), or None for full-parameter training."""
        return Lora.of(self.lora)

    def base(self) -> "ModelSpec":
        """The same model without the adapter of `adapter`: what a LoRA trainer and generator start from."""
        return dataclasses.replace(self, adapter=None)

    @property
    def random_init(self) -> bool:
        """True when build() makes fresh weights (nothing is loaded): only such a model needs a warm start."""
        return False

    def loading(self, path: str | None) -> "ModelSpec":
        """The same model, its weights read from `path` (a warm start or checkpoint of it, or a LoRA checkpoint: its
        base with it merged); None: unchanged."""
        return dataclasses.replace(self, path=path, adapter=None) if path else self

    def source(self) -> str:
        return self.path

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return load_tokenizer(self.source())

    def build(self, device: str | torch.device = "cpu", dtype: str | None = None) -> PreTrainedModel:
        """The model on `device`, in `dtype` (default: self.dtype), with `adapter` merged in when there is one."""
        model = self._load(device, dtype)
        if self.adapter:
            model = merge_adapter(model, self.adapter)
        return model

    def _load(self, device: str | torch.device, dtype: str | None) -> PreTrainedModel:
        model = load_causal_lm(self.source(), dtype or self.dtype, self.attn_implementation,
                               self.gradient_checkpointing)
        return model.to(device)

    def skeleton(self) -> torch.nn.Module:
        """The model's modules without its weights (on the meta device): what LoRA's targets are checked on."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(self.source(), local_files_only=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)

    def check_available(self) -> None:
        """Raise ValueError with one line saying what to do when the weights are not on this machine."""
        if self.path:
            why = _missing_from_dir(self.path)
            if why:
                raise ValueError(f"model.path={self.path} {why}: pass a local directory saved with save_pretrained")
            return
        raise ValueError("model.path is not set: give a local HF-format model directory")


@dataclass(frozen=True)
class Pretrained(ModelSpec):
    """A released model: `path`, or `hf_id` looked up in the local Hugging Face cache (never downloaded)."""

    hf_id: str | None = None
    dtype: str = "auto"  # as model.dtype's (config/model.py): bfloat16 where it is native, else float32

    def source(self) -> str:
        return self.path or self.hf_id

    def check_available(self) -> None:
        if self.path or not self.hf_id:
            return super().check_available()
        if not _in_hf_cache(self.hf_id):
            raise ValueError(
                f"model.path is not set and {self.hf_id} is not in the local Hugging Face cache "
                "(this machine cannot reach the Hub): download it elsewhere and pass model.path=<local dir>"
            )
