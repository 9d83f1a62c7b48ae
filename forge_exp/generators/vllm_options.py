"""The vLLM generator's knobs (conf/generator/vllm.yaml) as the engine receives them. Their schema, with the range
checks, is config/backends.py: VllmGenerator; importable without vLLM installed."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional



@dataclass(frozen=True)
class VllmOptions:
    name: str = "vllm"
    # Fraction of GPU memory the engine may take (weights + activations + KV cache). Lower it when the trainer
    # shares the GPU (colocated single-GPU layout); on CPU it is the fraction of RAM vLLM reserves, used only when
    # kv_cache_gib is unset.
    gpu_memory_utilization: float = 0.9
    # KV cache size in GiB; null: on GPU, what gpu_memory_utilization leaves; on CPU, 1 GiB (vLLM's CPU build would
    # otherwise reserve gpu_memory_utilization of all RAM, which a shared machine rarely has free).
    kv_cache_gib: Optional[float] = None
    # null: eager on CPU (the CPU build has no Triton to compile with), CUDA graphs on GPU.
    enforce_eager: Optional[bool] = None
    max_model_len: Optional[int] = None  # null: the model's max_position_embeddings
    tensor_parallel_size: int = 1  # engine workers, one GPU (or a share of the CPU cores) each
    max_num_seqs: Optional[int] = None  # sequences batched at once; null: vLLM's default for the device
    enable_prefix_caching: bool = True  # a group's n samples share one prompt prefill
    # Sleep mode frees the engine's GPU memory between rollouts (sleep/wake_up) so a colocated trainer can use it.
    # Needs a GPU: vLLM's CPU build ignores sleep.
    enable_sleep_mode: bool = False
    dtype: Optional[str] = None  # null: model.dtype
    # What happens to requests in flight when new weights arrive. keep: they are frozen, the weights swapped, and they
    # continue on the new weights (the returned version spans say which tokens each version sampled); wait: they
    # finish on the old weights first (strictly one version per completion; the update waits for the longest one).
    inflight_update: str = "keep"

    @classmethod
    def from_knobs(cls, **knobs) -> "VllmOptions":
        """Build from the YAML node's keys; an unknown key is an error that names it (no silent typo)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(knobs) - known)
        if unknown:
            raise ValueError(
                f"unknown generator key(s) {', '.join(unknown)} for generator=vllm; known: {', '.join(sorted(known))}"
            )
        return cls(**knobs)
