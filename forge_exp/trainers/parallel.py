"""Parallelism degrees of the TorchTitan trainer, checked before any process starts, and its DeviceMeshes.

    parallelism=single    one process: dp_shard = tp = 1 (TorchTitan still wraps FSDP2 of degree 1 for its mixed
                          precision policy: float32 master weights, bf16 compute on GPU)
    parallelism=fsdp      dp_shard = procs / dp_replicate; dp_replicate > 1 gives HSDP (shard within a group,
                          replicate across groups)
    parallelism=tp        tp = procs
    parallelism=fsdp_tp   tp given, dp_shard = procs / (tp · dp_replicate)

`degrees` is what the parallelism schema (config/services.py) calls with the config's numbers before any process
starts (so this module imports torch only in `parallel_dims`: validation stays light); `check_model` (tp divides
the heads and the vocabulary) runs when the engine reads the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_exp.choices import PARALLELISMS


@dataclass(frozen=True)
class Degrees:
    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


def degrees(parallelism: str, procs: int, tp: int = 1, dp_replicate: int = 1) -> Degrees:
    """The degrees `parallelism` gives on `procs` trainer processes (see the module docstring)."""
    where = f"parallelism={parallelism} with services.trainer.procs={procs}"
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism must be one of {', '.join(PARALLELISMS)}, got {parallelism!r}")
    if procs < 1 or tp < 1 or dp_replicate < 1:
        raise ValueError(f"{where}: procs, parallelism.tensor_parallel and parallelism.data_parallel_replicate must "
                         f"be >= 1")
    if parallelism == "single":
        if procs != 1:
            raise ValueError(f"{where}: single runs one trainer process; use parallelism=fsdp, tp or fsdp_tp")
        return Degrees(1, 1, 1)
    if parallelism == "tp":
        if dp_replicate != 1:
            raise ValueError(f"{where}: parallelism.data_parallel_replicate needs parallelism=fsdp or fsdp_tp")
        return Degrees(1, 1, procs)
    tp = tp if parallelism == "fsdp_tp" else 1
    if procs % (tp * dp_replicate):
        raise ValueError(
            f"{where}: procs must be a multiple of parallelism.tensor_parallel={tp} x "
            f"parallelism.data_parallel_replicate={dp_replicate}"
        )
    return Degrees(dp_replicate, procs // (tp * dp_replicate), tp)


def check_model(d: Degrees, n_heads: int, n_kv_heads: int, vocab_size: int, where: str = "trainer=titan") -> None:
    """Each TP rank holds whole attention heads and an equal slice of the vocabulary (the vocab-parallel head)."""
    for name, n in (("attention heads", n_heads), ("key/value heads", n_kv_heads), ("vocabulary size", vocab_size)):
        if n % d.tp:
            raise ValueError(f"{where}: tensor-parallel degree {d.tp} must divide the model's {name} ({n})")


def parallel_dims(d: Degrees, device_type: str):
    """TorchTitan's ParallelDims for `d` on the initialised world, meshes built ("partial_dtensor" backend: FSDP2 on
    the (dp_replicate, fsdp) mesh, DTensor TP on the tp mesh)."""
    import torch.distributed as dist

    from forge_exp.trainers.titan_compat import cpu_meshes, titan

    titan()
    from torchtitan.distributed import ParallelDims

    world = dist.get_world_size()
    if world != d.world:
        raise ValueError(
            f"the torch.distributed world has {world} processes but the degrees need {d.world} "
            f"(dp_replicate={d.dp_replicate} x dp_shard={d.dp_shard} x tp={d.tp})"
        )
    pd = ParallelDims(
        dp_replicate=d.dp_replicate, dp_shard=d.dp_shard, cp=1, tp=d.tp, pp=1, ep=1, world_size=world,
        spmd_backend="partial_dtensor",
    )
    with cpu_meshes(device_type):
        pd.build_mesh()
    return pd
