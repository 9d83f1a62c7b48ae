"""The one place that adapts torch / TorchTitan 0.3.0 to each other; every other module imports TorchTitan from here.

Each shim is active only where it is needed:

- torch < 2.12 (the GPU image's 2.11): `torch.distributed.fsdp.DataParallelMeshDims` does not exist, and
  TorchTitan imports it at module level (torchtitan/distributed/full_dtensor.py). It is only *used* by the
  "full_dtensor" / "spmd_types" backends; forge-exp runs the "partial_dtensor" backend, which passes None there, so
  a plain dataclass of the same shape is enough to import.
- no accelerator (CPU + gloo): TorchTitan's `tools.utils.device_type` falls back to "cuda" when torch sees no
  accelerator, and `ParallelDims.build_mesh` builds its DeviceMesh on that device type, which fails on a CPU-only
  torch. `cpu_meshes()` makes build_mesh use "cpu" for the duration of the call.

Not shimmed, avoided instead (see trainers/titan.py): TorchTitan's flex-attention masks (torch 2.11's
`create_block_mask` has no `separate_full_blocks`), its ChunkedLossWrapper (fails in backward with tied
embeddings) and `full_state_dict` loading through the fused-QKV state-dict hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Iterator

import torch
import torch.distributed.fsdp as torch_fsdp

_PATCHED = False


def _stand_in_mesh_dims() -> None:
    if hasattr(torch_fsdp, "DataParallelMeshDims"):
        return

    @dataclasses.dataclass
    class DataParallelMeshDims:  # same fields as torch >= 2.12's; never handed to fully_shard here
        shard: str | tuple[str, ...] | None = None
        replicate: str | tuple[str, ...] | None = None

    torch_fsdp.DataParallelMeshDims = DataParallelMeshDims


def titan():
    """Import TorchTitan (after the shims) and return the `torchtitan` package."""
    global _PATCHED
    if not _PATCHED:
        _stand_in_mesh_dims()
        _PATCHED = True
    try:
        return importlib.import_module("torchtitan")
    except ImportError as e:
        raise ImportError(
            f"trainer=titan needs TorchTitan: pip install 'forge-exp[titan]' (torchtitan 0.3.0) ({e})"
        ) from e


@contextlib.contextmanager
def cpu_meshes(device_type: str) -> Iterator[None]:
    """While building TorchTitan's meshes, use `device_type` ("cpu" without an accelerator) instead of its
    hard-wired "cuda" fallback."""
    titan()
    pd = importlib.import_module("torchtitan.distributed.parallel_dims")
    old = pd.device_type
    pd.device_type = device_type
    try:
        yield
    finally:
        pd.device_type = old


def accelerator_type() -> str:
    """"cuda" when torch sees a GPU, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"
