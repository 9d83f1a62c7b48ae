"""Code that runs inside every vLLM worker process: mixed into vLLM's Worker through
`AsyncEngineArgs(worker_extension_cls="forge_exp.generators.vllm_worker.WeightLoader")`.

Why not pass tensors to `collective_rpc("reload_weights", ...)` directly: vLLM's RPC decodes tensors in untyped
arguments into raw (dtype, shape, memoryview) triples in the engine process, which then cannot be pickled on to
the workers ("cannot pickle memoryview objects"). Tensors therefore travel as plain bytes with their dtype and shape
(`pack`), and each worker rebuilds them and reloads in place by HF name; vLLM's loader maps the names onto its
fused and sharded parameters (qkv_proj, gate_up_proj, the tensor-parallel shard of each rank).

Imports only torch: vLLM imports this module in each worker.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

Packed = tuple[str, str, list[int], bytes]  # (HF name, torch dtype name, shape, raw bytes)


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


class WeightLoader:
    """Worker mix-in. `self` is a vLLM Worker (it has `reload_weights`)."""

    def forge_exp_load_weights(self, packed: list[Packed]) -> int:
        """Reload the model in place from packed HF-named tensors; returns how many tensors it received."""
        self.reload_weights(weights_iterator=unpack(packed))
        return len(packed)
