"""HF-format checkpoints: safetensors weights + config.json + tokenizer files in one directory.

A directory written here loads with plain `transformers.AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)`, and as `model.path=<dir>` in any experiment. Its last file is MANIFEST: the
size and sha256 of every other file, each flushed to disk first, so `verify_manifest` can tell a checkpoint that a
crash, a full disk or a copy cut short left damaged from an intact one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from forge_exp.models.hf import load_causal_lm, load_tokenizer

if TYPE_CHECKING:  # only annotations here: the modeling code loads with the model (models/hf.py)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OPTIMIZER = "optimizer.pt"  # optimizer state_dict (torch.save) beside the weights, for resuming training
MANIFEST = "manifest.json"  # {relative path: {"size", "sha256"}} of every other file, written last


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
        try:
            if hasattr(model, "peft_config"):  # LoRA: the adapter alone, in peft's format (models/lora.py); no
                model.save_pretrained(tmp, save_embedding_layers=False)  # embedding is adapted (keeps peft off the Hub)
            else:
                model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            for name, obj in (metadata or {}).items():
                (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True))
            if optimizer is not None:
                torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
            write_manifest(tmp)
        except Exception as e:
            if full := disk_full(tmp, e):  # torch says "unexpected pos 425152 vs 425044" when the disk is full
                raise OSError(errno.ENOSPC, f"{full} while writing {directory}; free space there, or write "
                                            f"checkpoints elsewhere (checkpoint.dir)") from e
            raise
        try:
            move_into_place(tmp, directory)
        except OSError:
            if not any((directory / name).is_file() for name in ("config.json", "adapter_config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


FULL_BYTES = 16 << 20  # a write failed with less than this free: the disk was full


def disk_full(where: Path, error: BaseException) -> str | None:
    """'no space left on device (N bytes free)' when `error` (or what caused it) is ENOSPC, or so little is left on
    `where`'s file system that it was: libraries that write through their own streams lose the errno."""
    free = shutil.disk_usage(where).free
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            break
        cause = cause.__cause__ or cause.__context__
    if cause is None and free >= FULL_BYTES:
        return None
    return f"no space left on device ({free} bytes free)"


def write_manifest(directory: str | Path) -> None:
    """Flush every file under `directory` to disk and record its size and sha256 in MANIFEST, written last."""
    root = Path(directory)
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[str(path.relative_to(root))] = {"size": path.stat().st_size, "sha256": _sha256(path, flush=True)}
    with open(root / MANIFEST, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path, flush: bool = False) -> str:
    """The file's sha256, read in 8 MiB chunks; flush=True also puts it on disk (a rename is not a flush)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
        if flush:
            os.fsync(f.fileno())
    return digest.hexdigest()


def verify_manifest(directory: str | Path) -> str | None:
    """Why the checkpoint in `directory` is not as its MANIFEST says (a file missing, cut short or changed), or
    None when it is; a directory without MANIFEST (written before it existed) is not checked."""
    root = Path(directory)
    if not (root / MANIFEST).is_file():
        return None
    try:
        files = json.loads((root / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    for name, want in files.items():
        path = root / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["size"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['size']}"
        if _sha256(path) != want["sha256"]:
            return f"{name} differs from what was written (sha256)"
    return None


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
