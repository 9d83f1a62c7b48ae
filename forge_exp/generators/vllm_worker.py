"""Code that runs inside every vLLM worker process: mixed into vLLM's Worker through
`AsyncEngineArgs(worker_extension_cls="forge_exp.generators.vllm_worker.WeightLoader")`.

Why not pass tensors to `collective_rpc("reload_weights", ...)` directly: vLLM's RPC decodes tensors in untyped
arguments into raw (dtype, shape, memoryview) triples in the engine process, which then cannot be pickled on to
the workers ("cannot pickle memoryview objects"). CPU tensors therefore travel as plain bytes with their dtype and
shape (`pack`); CUDA tensors travel as CUDA IPC handles (`share`: torch's own reductions, a few hundred bytes a
tensor), which each worker opens to read the sender's memory in place, GPU to GPU. Either way each worker reloads
in place by HF name; vLLM's loader maps the names onto its fused and sharded parameters (qkv_proj, gate_up_proj,
the tensor-parallel shard of each rank) and casts to its dtype.

Imports only torch: vLLM imports this module in each worker.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable

import torch

Packed = tuple[str, str, list[int], bytes]  # (HF name, torch dtype name, shape, raw bytes)
Shared = tuple[str, bytes]  # (HF name, pickled arguments of torch's rebuild_cuda_tensor)


def pack(weights: Iterable[tuple[str, torch.Tensor]]) -> list[Packed]:
    out = []
    for name, t in weights:
        t = t.detach().to("cpu").contiguous()
        # a uint8 view reinterprets the storage for any dtype (bfloat16 has no numpy equivalent)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        out.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), raw))
    return out


def unpack(packed: Iterable[Packed]) -> Iterable[tuple[str, torch.Tensor]]:
    for name, dtype, shape, raw in packed:
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        yield name, flat.view(getattr(torch, dtype)).reshape(shape)


def share(weights: Iterable[tuple[str, torch.Tensor]]) -> list[Shared]:
    """CUDA IPC handles of contiguous CUDA tensors. The caller keeps the tensors alive (and unchanged) until every
    receiver has loaded them. Their writes are finished first: a receiver reads on its own stream."""
    from torch.multiprocessing.reductions import reduce_tensor

    weights = list(weights)
    torch.cuda.synchronize()
    out = []
    for name, t in weights:
        if not t.is_contiguous():
            raise ValueError(f"share: {name} is not contiguous (a copy would be freed before the receiver reads it)")
        _, args = reduce_tensor(t.detach())
        out.append((name, pickle.dumps(args)))
    return out


def opened(shared: Iterable[Shared], device: torch.device) -> Iterable[tuple[str, torch.Tensor]]:
    """The tensors behind `share`'s handles, mapped on `device` (this process's index of the same GPU)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    for name, blob in shared:
        args = list(pickle.loads(blob))
        args[6] = device.index  # reduce_tensor's device: the sender's index, ours may differ
        yield name, rebuild_cuda_tensor(*args)


class WeightLoader:
    """Worker mix-in. `self` is a vLLM Worker (it has `reload_weights`)."""

    def forge_exp_load_weights(self, packed: list[Packed]) -> int:
        """Reload the model in place from packed HF-named tensors; returns how many tensors it received."""
        self.reload_weights(weights_iterator=unpack(packed))
        return len(packed)

    def forge_exp_load_shared(self, shared: list[Shared]) -> int:
        """As forge_exp_load_weights, from CUDA IPC handles (`share`) of tensors on this worker's GPU."""
        self.reload_weights(weights_iterator=opened(shared, self.device))
        torch.cuda.synchronize(self.device)  # done reading the sender's memory before it may change
        return len(shared)
