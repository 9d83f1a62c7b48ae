"""Schemas of the `trainer` and `generator` groups: which engine trains and which one samples. The GRPO loop never
knows which one runs; each engine is built in its service's process through `_target_`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional

from forge_exp.checks import at_least, within
from forge_exp.choices import AttentionBackend, Checkpointing, DType, InflightUpdate


@dataclass
class TrainerBackend:
    """conf/trainer/hf.yaml: one process, the whole model, transformers' modules (forge_exp/trainers/hf.py)."""

    _target_: str = "forge_exp.trainers.hf.HFTrainer"
    name: str = "hf"
    # True when every trainer process runs the engine as one torch.distributed world (collective calls)
    collective: ClassVar[bool] = False
    sft: ClassVar[bool] = True  # runs algorithm=sft too
    lora: ClassVar[bool] = True  # trains LoRA adapters (model.lora)


@dataclass
class TitanTrainerConfig(TrainerBackend):
    """conf/trainer/titan.yaml: TorchTitan's Qwen3 / Llama 3 over services.trainer.procs processes, sharded as
    `parallelism` says (trainers/titan.py, docs/titan.md). `pip install 'forge-exp[titan]'`."""

    _target_: str = "forge_exp.trainers.titan_backend.TitanBackend"
    name: str = "titan"
    collective: ClassVar[bool] = True
    sft: ClassVar[bool] = False
    lora: ClassVar[bool] = False
    activation_checkpointing: Checkpointing = Checkpointing.none  # none | full | selective
    compile: bool = False  # TorchTitan's per-block torch.compile (GPU)
    attention: AttentionBackend = AttentionBackend.sdpa  # sdpa | flex (flex has no backward on CPU)
    chunk_rows: int = 4096  # rows of logits alive at once in the chunked logprobs (memory vs speed)
    param_dtype: Optional[DType] = None  # compute dtype; null: bfloat16 on GPU, float32 on CPU (weights stay float32)

    def __post_init__(self) -> None:
        at_least("chunk_rows", self.chunk_rows, 1)


@dataclass
class GeneratorBackend:
    _target_: str = "forge_exp.generators.native.NativeEngine"
    name: str = "torch"
    # True when one process drives services.generator.procs devices itself (vLLM's tensor-parallel workers): the
    # runtime then starts one process per replica and hands it every device of its replica
    drives_workers: ClassVar[bool] = False


@dataclass
class TorchGenerator(GeneratorBackend):
    """conf/generator/torch.yaml: the torch-native engine (generators/native.py): a static KV cache of `slots` rows,
    continuous batching, decode steps as CUDA graphs on GPU. KV memory: 2 × layers × (slots + 1) × max_len ×
    kv_heads × head_dim × dtype bytes."""

    slots: Optional[int] = None  # rows decoded together; null: the rows of the batches that may be in flight
    max_len: Optional[int] = None  # prompt + new tokens per row; null: the dataset's prompt budget + max_new_tokens
    sync_every: Optional[int] = None  # decode steps between host checks for finished rows; null: 16 on GPU, 1 on CPU
    cuda_graphs: bool = True  # capture decode steps as CUDA graphs (GPU only)
    prefill_tokens: int = 8192  # prompt tokens per prefill forward (bounds its activation memory)
    eos_token_ids: Optional[List[int]] = None  # null: the tokenizer's EOS and the model's generation_config EOS

    def __post_init__(self) -> None:
        for key in ("slots", "max_len", "sync_every"):
            if getattr(self, key) is not None:
                at_least(key, getattr(self, key), 1)
        at_least("prefill_tokens", self.prefill_tokens, 1)


@dataclass
class VllmGenerator(GeneratorBackend):
    """conf/generator/vllm.yaml: vLLM's engine (generators/vllm.py; docs/generators.md). Needs
    `pip install 'forge-exp[vllm]'` (GPU) or the CPU venv of `bash launchers/setup.sh --vllm`."""

    _target_: str = "forge_exp.generators.vllm.VllmEngine"
    name: str = "vllm"
    drives_workers: ClassVar[bool] = True
    gpu_memory_utilization: float = 0.9  # the engine's share of GPU memory; lower it beside a colocated trainer
    kv_cache_gib: Optional[float] = None  # null: what gpu_memory_utilization leaves on GPU; 1 GiB on CPU
    enforce_eager: Optional[bool] = None  # null: eager on CPU, CUDA graphs on GPU
    max_model_len: Optional[int] = None  # null: the dataset's prompt budget + max_new_tokens
    tensor_parallel_size: Optional[int] = None  # null: services.generator.procs
    max_num_seqs: Optional[int] = None  # sequences batched at once; null: vLLM's default
    enable_prefix_caching: bool = True  # a group's n samples share one prompt prefill
    enable_sleep_mode: bool = False  # GPU only: sleep()/wake_up() free the engine's memory for a colocated trainer
    dtype: Optional[DType] = None  # null: model.dtype
    inflight_update: InflightUpdate = InflightUpdate.keep  # keep: in-flight requests continue on new weights

    def __post_init__(self) -> None:
        within("gpu_memory_utilization", self.gpu_memory_utilization, 0, 1, low_open=True)
        if self.kv_cache_gib is not None:
            within("kv_cache_gib", self.kv_cache_gib, 0, float("inf"), low_open=True)
        for key in ("max_model_len", "tensor_parallel_size", "max_num_seqs"):
            if getattr(self, key) is not None:
                at_least(key, getattr(self, key), 1)
