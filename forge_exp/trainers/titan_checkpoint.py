"""Checkpoints of the TorchTitan trainer: HF safetensors in and out, and sharded torch.distributed.checkpoint (DCP).

    load_hf   every rank reads, one tensor at a time, only the HF tensors of each parameter and keeps its own shard
              (safetensors are memory-mapped: no rank holds more than one full tensor)
    save_hf   the HF format transformers and vLLM load: config.json + safetensors (+ index when sharded) + tokenizer.
              Every rank takes part in gathering each tensor; rank 0 writes, holding at most one file's worth of
              tensors (max_shard_bytes) in CPU memory
    save_dcp  each rank writes its shards of the weights and AdamW state (DCP), plus the step; a checkpoint saved
    load_dcp  with N trainer processes loads with M (DCP re-shards by global offsets)

The DCP state is keyed by the parameters' own names (wrapper-free), not by `model.state_dict()`: TorchTitan's fused
QKV state-dict hooks split wqkv into wq/wk/wv there, replicating it on every rank.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor, Replicate

from forge_exp.models.checkpoint import move_into_place

# The trainer these functions read and restore (trainers/titan.py, which imports this module: named, not imported)
TitanTrainer = Any

MAX_SHARD_BYTES = 4 * 2**30
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _weight_files(path: Path) -> dict[str, Path]:
    """HF tensor name → the safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"trainer=titan loads safetensors: {path} has no model.safetensors(.index.json)")
    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def load_hf(trainer: TitanTrainer, path: str | Path) -> None:
    path = Path(path).expanduser()
    files = _weight_files(path)
    handles: dict[Path, object] = {}
    try:
        with torch.no_grad():
            for fqn, hf_names in trainer.names.plan:
                hf = {}
                for name in hf_names:
                    if name not in files:
                        raise KeyError(f"{path}: checkpoint has no tensor {name!r} (model.path must match config.json)")
                    f = handles.get(files[name]) or handles.setdefault(
                        files[name], safe_open(str(files[name]), framework="pt")
                    )
                    hf[name] = f.get_tensor(name)
                full = trainer.names.from_hf(fqn, hf, trainer._qkv.get(fqn))
                assign(trainer.params[fqn], full)
    finally:
        handles.clear()


def assign(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor `full` into `param` (a DTensor shard or a plain tensor)."""
    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(f"checkpoint tensor has shape {tuple(full.shape)}, the model expects {tuple(param.shape)}")
    full = full.to(device=param.device if not isinstance(param, DTensor) else param.to_local().device, dtype=param.dtype)
    if isinstance(param, DTensor):
        mesh = param.device_mesh
        replicated = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
        param.to_local().copy_(replicated.redistribute(mesh, param.placements).to_local())  # local slicing only
    else:
        param.copy_(full)


def save_hf(
    trainer: TitanTrainer,
    directory: str | Path,
    tokenizer=None,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write an HF checkpoint of the current weights (collective); returns the directory. Written to a temporary
    sibling and renamed into place by rank 0, so a reader never sees half a checkpoint."""
    directory = Path(directory).expanduser().resolve()
    writer = dist.get_rank() == 0
    size = torch.empty((), dtype=dtype).element_size()
    shards: list[list[str]] = [[]]
    used = 0
    for name, shape in trainer.names.hf_shapes.items():  # plan the files up front: names are known before the data
        n = size * _numel(shape)
        if shards[-1] and used + n > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += n
    file_of = {}
    for i, names in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        file_of.update({n: fname for n in names})
    tmp = None
    if writer:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        tmp.chmod(0o755)
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in trainer.named_full_weights(dtype):
        if not writer:
            continue
        pending[name] = tensor.detach().to("cpu").contiguous()
        fname = file_of[name]
        if all(n in pending for n, f in file_of.items() if f == fname):
            save_file({n: pending.pop(n) for n in list(pending) if file_of[n] == fname}, str(tmp / fname),
                      metadata={"format": "pt"})
    if writer:
        total = size * sum(_numel(s) for s in trainer.names.hf_shapes.values())
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": file_of}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        config = dict(trainer.hf_config)
        config["torch_dtype"] = config["dtype"] = DTYPE_NAMES[dtype]
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        move_into_place(tmp, directory)  # a reader finds the old copy or the new one, never none
    dist.barrier()
    return directory


def _dcp_state(trainer: TitanTrainer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return {
        "model": dict(trainer.params),
        "optim": get_optimizer_state_dict(trainer.model, trainer.optimizer),
        "step": torch.tensor(trainer.step),
    }


def save_dcp(trainer: TitanTrainer, directory: str | Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(_dcp_state(trainer), checkpoint_id=str(Path(directory).expanduser()))


def load_dcp(trainer: TitanTrainer, directory: str | Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    directory = Path(directory).expanduser()
    if not (directory / ".metadata").is_file():
        raise FileNotFoundError(f"{directory} is not a torch.distributed.checkpoint directory (no .metadata)")
    state = _dcp_state(trainer)
    dcp.load(state, checkpoint_id=str(directory))  # in place: weights into the parameters' shards
    set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optim"])
    trainer.step = int(state["step"])


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
