"""The generation engines' knobs (conf/generator/*.yaml), torch-free: each dataclass is its engine's schema (config/
store.py registers it as `schema/generator/<name>`), with the defaults and range checks stated here once. The engine
takes the node's keys and parses them into its dataclass (`NativeEngine(model, device, seed, **knobs)`), so a knob
has no second list to drift from.

A null size knob means one thing in a run and a fallback for an engine built alone (a script, a test): in a run the
generator service fills it from the run's shape before the engine starts (apps: generator_sizes; actors/generator.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, List, Optional

from forge_exp.checks import at_least, within
from forge_exp.choices import DType, InflightUpdate


@dataclass
class EngineOptions:
    _target_: str = "forge_exp.generators.native.NativeEngine"
    name: str = "torch"
    # True when one process drives services.generator.procs devices itself (vLLM's tensor-parallel workers): the
    # runtime then starts one process per replica and hands it every device of its replica
    drives_workers: ClassVar[bool] = False

    @classmethod
    def parse(cls, knobs: dict):
        """The engine's options from its YAML node's keys; an unknown key is an error that names it (no silent typo)."""
        known = {f.name for f in fields(cls)} - {"_target_"}
        unknown = sorted(set(knobs) - known)
        if unknown:
            raise ValueError(f"generator.{unknown[0]} is not a knob of generator={cls.name}; known: "
                             f"{', '.join(sorted(known))}")
        return cls(**knobs)


@dataclass
class NativeKnobs(EngineOptions):
    """conf/generator/torch.yaml: the torch-native engine (generators/native.py): a static KV cache of `slots` rows,
    continuous batching, decode steps as CUDA graphs on GPU. KV cache memory: 2 × layers × (slots + 1) × max_len ×
    kv_heads × head_dim × dtype bytes (Qwen3-1.7B in bf16: 114,688 bytes per token and slot, so 64 slots × 1024
    tokens = 7.5 GB)."""

    # rows decoded together (KV-cache rows); null: in a run, the rows of the batches that may be in flight
    # (prompts_per_step × group_size × (max_policy_age + 1)); an engine built alone: ALONE_SLOTS
    slots: Optional[int] = None
    # prompt + new tokens per row; null: in a run, the dataset's prompt budget + max_new_tokens; an engine built
    # alone: the model's max positions, at most 1024
    max_len: Optional[int] = None
    sync_every: Optional[int] = None  # decode steps between host checks for finished rows; null: 16 on GPU, 1 on CPU
    # queue the next chunk of sync_every steps before reading the last one back, so the GPU never waits for the host
    # in between; null: on GPU (on CPU every step has run by the time it is queued: nothing to hide)
    lookahead: Optional[bool] = None
    cuda_graphs: bool = True  # capture decode steps as CUDA graphs (GPU only)
    # decode on the GPU's highest-priority stream (GPU only): a trainer sharing the GPU (services=single_gpu) runs its
    # kernels in the gaps between the decode steps' instead of ahead of them
    high_priority: bool = True
    prefill_tokens: int = 8192  # prompt tokens per prefill forward (bounds its activation memory)
    # an idle engine, on its first call, waits while more calls keep coming within this many milliseconds, so that
    # calls made together (a wave of rollout batches) prefill and decode as one batch instead of the later ones
    # joining a chunk of sync_every steps later; null: 2 on GPU, 0 on CPU
    gather_ms: Optional[float] = None
    # the samples of a prompt read its K/V from the first sample's slot instead of copies in their own (GPU only:
    # the Triton attention kernel; the torch ops always copy). Fewer bytes a decode step (~1.6 of ~7.1 GB at 64
    # rows of the gpu.md shape), 2-3% more tokens/s alone on the H200 (benchmarks/gpu.md; docs/generators.md)
    share_prompt_kv: bool = True
    eos_token_ids: Optional[List[int]] = None  # null: the tokenizer's EOS and the model's generation_config EOS

    ALONE_SLOTS: ClassVar[int] = 256

    def __post_init__(self) -> None:
        for key in ("slots", "max_len", "sync_every"):
            if getattr(self, key) is not None:
                at_least(key, getattr(self, key), 1)
        at_least("prefill_tokens", self.prefill_tokens, 1)
        if self.gather_ms is not None:
            at_least("gather_ms", self.gather_ms, 0)


@dataclass
class VllmOptions(EngineOptions):
    """conf/generator/vllm.yaml: vLLM's engine (generators/vllm.py; docs/generators.md). Needs
    `pip install 'forge-exp[vllm]'` (GPU) or the CPU venv of `bash launchers/setup.sh --vllm`. The vLLM engine
    arguments these make: vllm_options.py."""

    _target_: str = "forge_exp.generators.vllm.VllmEngine"
    name: str = "vllm"
    drives_workers: ClassVar[bool] = True
    # the engine's share of GPU memory (weights + activations + KV cache); lower it beside a colocated trainer. On
    # CPU it is the share of RAM vLLM reserves, used only when kv_cache_gib is null
    gpu_memory_utilization: float = 0.9
    # KV cache size in GiB; null: on GPU, what gpu_memory_utilization leaves; on CPU, 1 GiB (vLLM's CPU build would
    # otherwise reserve gpu_memory_utilization of all RAM, which a shared machine rarely has free)
    kv_cache_gib: Optional[float] = None
    # null: eager on CPU (its build has no Triton to compile with), CUDA graphs on GPU
    enforce_eager: Optional[bool] = None
    # null: in a run, the dataset's prompt budget + max_new_tokens; an engine built alone: the model's
    # max_position_embeddings (vLLM's own default)
    max_model_len: Optional[int] = None
    # engine workers, one GPU (or a share of the CPU cores) each; null: in a run, services.generator.procs; an
    # engine built alone: 1
    tensor_parallel_size: Optional[int] = None
    max_num_seqs: Optional[int] = None  # sequences batched at once; null: vLLM's default for the device
    enable_prefix_caching: bool = True  # a group's n samples share one prompt prefill
    # GPU only (vLLM's CPU build has no sleep mode): sleep()/wake_up() free the engine's memory between rollouts
    # for a colocated trainer
    enable_sleep_mode: bool = False
    dtype: Optional[DType] = None  # null: model.dtype
    # what happens to requests in flight when new weights arrive. keep: they are frozen, the weights swapped, and they
    # continue on the new weights (the returned version spans say which tokens each version sampled); wait: they
    # finish on the old weights first (strictly one version per completion; the update waits for the longest one)
    inflight_update: InflightUpdate = InflightUpdate.keep

    def __post_init__(self) -> None:
        within("gpu_memory_utilization", self.gpu_memory_utilization, 0, 1, low_open=True)
        if self.kv_cache_gib is not None:
            within("kv_cache_gib", self.kv_cache_gib, 0, float("inf"), low_open=True)
        for key in ("max_model_len", "tensor_parallel_size", "max_num_seqs"):
            if getattr(self, key) is not None:
                at_least(key, getattr(self, key), 1)
