"""HF-format checkpoints: safetensors weights + config.json + tokenizer files in one directory.

A directory written here loads with plain `transformers.AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)`, and as `model.path=<dir>` in any experiment.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from forge_exp.models.hf import load_causal_lm, load_tokenizer

if TYPE_CHECKING:  # only annotations here: the modeling code loads with the model (models/hf.py)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OPTIMIZER = "optimizer.pt"  # optimizer state_dict (torch.save) beside the weights, for resuming training


def save_hf_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    directory: str | Path,
    metadata: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Write model (safetensors) and tokenizer to `directory`, replacing what was there; return the path.
    `metadata` maps extra file names to JSON-able objects written alongside (e.g. the metrics that produced it);
    `optimizer`, when given, is saved as OPTIMIZER so that training can resume.

    Written to a temporary sibling first and renamed into place, so a reader never sees a half-written checkpoint.
    If another process finishes the same directory first, its copy is kept.
    """
    directory = Path(directory).expanduser().resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is read by other processes and users
    try:
        if hasattr(model, "peft_config"):  # LoRA: the adapter alone, in peft's format (models/lora.py); no embedding
            model.save_pretrained(tmp, save_embedding_layers=False)  # is adapted (saying so keeps peft off the Hub)
        else:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, obj in (metadata or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
        try:
            move_into_place(tmp, directory)
        except OSError:
            if not any((directory / name).is_file() for name in ("config.json", "adapter_config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


AT_FDCWD = -100
RENAME_EXCHANGE = 2  # renameat2(2): swap two paths atomically


def move_into_place(tmp: Path, directory: Path) -> None:
    """Make the finished directory `tmp` be `directory`, so that a reader of `directory` (another run loading a shared
    warm-start cache, say) finds the old or the new copy, never none: one that exists is swapped with `tmp` in one
    step (renameat2 RENAME_EXCHANGE), then the old copy, now at `tmp`, is removed. Where the filesystem cannot swap,
    the old one is removed, then `tmp` renamed in. OSError if another process put a directory there meanwhile."""
    if directory.exists() and _exchange(tmp, directory):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the C library or the filesystem cannot."""
    import ctypes
    import errno
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):  # glibc < 2.28
        return False
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # this filesystem does not swap
        return False
    raise OSError(err, os.strerror(err), str(b))


def load_hf_checkpoint(
    directory: str | Path, dtype: str = "float32", attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load `(model, tokenizer)` from a directory written by `save_hf_checkpoint` (or any local HF model dir)."""
    path = str(Path(directory).expanduser())
    return load_causal_lm(path, dtype=dtype, attn_implementation=attn_implementation), load_tokenizer(path)
