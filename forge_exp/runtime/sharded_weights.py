"""A sharded trainer's side of weight sync (runtime/weight_sync.py has the protocol and the single-process side):
every rank takes part in gathering each version's full tensors once, and rank 0 keeps them in one flat snapshot,
which the generators read like a single process's parameters. An unsharded source skips the gather."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Protocol

import torch
import torch.distributed as dist

from forge_exp.models.device import wait_for
from forge_exp.runtime.weight_sync import WeightPublisher, layout_of, views

log = logging.getLogger(__name__)


class FullWeights(Protocol):
    """A sharded trainer's weights as full tensors, by the generator model's parameter names and in its order."""

    def weight_layout(self, dtype: torch.dtype | None = None) -> list[tuple[str, tuple[int, ...], torch.dtype]]: ...

    def named_full_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]: ...

    def whole_weight_views(self) -> list[tuple[str, torch.Tensor]] | None: ...


class ShardedWeightPublisher(WeightPublisher):
    """A publisher on every rank of a sharded trainer. `capture()` is collective (all ranks, once per version);
    `publish`/`update`/`push` are rank 0's alone, and read the snapshot that `capture` filled. `dtype` is what moves
    (bf16 halves the bytes of float32 master weights; generators convert on load)."""

    def __init__(self, source: FullWeights, rank: int, device: torch.device, dtype: torch.dtype | None = None):
        self.source, self.rank, self.dtype = source, rank, dtype
        spec = {n: torch.empty(shape, dtype=dt, device="meta") for n, shape, dt in source.weight_layout(dtype)}
        self.names = list(spec)
        slots, nbytes = layout_of(spec)
        params: dict[str, torch.Tensor] = {}
        self._snapshot = None
        self._views: list[tuple[str, torch.Tensor]] | None = None  # set at the first capture; [] gathers
        if rank == 0:  # one flat buffer: the copy generators read, and on CUDA the IPC allocation itself
            self._snapshot = torch.empty(nbytes, dtype=torch.uint8, device=device)
            params = dict(zip(self.names, views(self._snapshot, slots)))
        else:
            params = {n: torch.empty(0, device=device) for n in self.names}  # never published
        super().__init__(params)

    def capture(self) -> dict[str, float]:
        """Gather every full tensor once (collective); rank 0 keeps them in the snapshot. Returns seconds and bytes
        (this rank's share of the all-gathers, and the snapshot's size). An unsharded source is copied from its
        parameters' own storage instead (`whole_weight_views`), checked against the gathered stream the first time."""
        t0 = time.perf_counter()
        if self._views is None:
            alone = not dist.is_initialized() or dist.get_world_size() == 1
            views = self.source.whole_weight_views() if alone else None
            self._views = views or []
            if views:  # the first version both ways: the views must hold what the stream holds
                self._copy_views()
                stats = self._gather(check=True)
                return {**stats, "sync/capture_seconds": time.perf_counter() - t0}
        if self._views:
            self._copy_views()
            stats = {"sync/full_bytes": float(self.payload_bytes), "sync/snapshot_bytes": float(self.payload_bytes)}
        else:
            stats = self._gather()
        return {**stats, "sync/capture_seconds": time.perf_counter() - t0}

    def _copy_views(self) -> None:
        with torch.no_grad():
            for name, view in self._views:
                self.params[name].view(view.shape).copy_(view)
        wait_for(self.device)

    def _gather(self, check: bool = False) -> dict[str, float]:
        got, snapshot_bytes, differs = 0, 0, []
        with torch.no_grad():
            for (name, tensor), expected in zip(self.source.named_full_weights(self.dtype), self.names, strict=True):
                if name != expected:
                    raise RuntimeError(f"weight stream out of order: {name!r} where {expected!r} was expected")
                got += tensor.numel() * tensor.element_size()
                if self.rank == 0:
                    if check and not torch.equal(self.params[name], tensor):
                        differs.append(name)
                    self.params[name].copy_(tensor)
                    snapshot_bytes += tensor.numel() * tensor.element_size()
        wait_for(self.device)
        if differs:  # a layout the views got wrong: every later version is gathered
            log.warning("weight sync: %d parameter views (%s, ...) differ from the gathered weights; gathering from "
                        "now on", len(differs), differs[0])
            self._views = []
        return {"sync/full_bytes": float(got), "sync/snapshot_bytes": float(snapshot_bytes)}

    def _fill_buffer(self) -> tuple:
        if self._ipc is None:
            from torch.multiprocessing.reductions import reduce_tensor

            self._ipc = reduce_tensor(self._snapshot)  # the snapshot has the published layout already: no copy
        return self._ipc
