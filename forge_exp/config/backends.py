"""Schemas of the `trainer` group: which engine trains. The GRPO loop never knows which one runs; each engine is
built in its service's process through `_target_`. (The `generator` group's schemas are the engines' own knobs:
generators/options.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from forge_exp.checks import at_least
from forge_exp.choices import AttentionBackend, Checkpointing, DType


@dataclass
class TrainerBackend:
    """conf/trainer/hf.yaml: one process, the whole model, transformers' modules (forge_exp/trainers/hf.py)."""

    _target_: str = "forge_exp.trainers.hf.HFTrainer"
    name: str = "hf"
    # True when every trainer process runs the engine as one torch.distributed world (collective calls)
    collective: ClassVar[bool] = False
    sft: ClassVar[bool] = True  # runs algorithm=sft too
    lora: ClassVar[bool] = True  # trains LoRA adapters (model.lora)
    # the rows of a micro-batch that share a prompt (a group's samples) run it once: one sequence of the prompt and
    # their responses, each response attending to the prompt and itself (models/packing.py), in the trainer's
    # forward and the reference model's. The same logprobs and gradients; fewer tokens a forward (29% at 8 samples
    # of 256 + 512). The attention then takes a dense mask (titan on CUDA: flex, which skips its empty blocks).
    # The batch's rows are ordered by prompt first, so that a micro-batch holds whole groups. null: the engine's
    # choice (titan's: on for CUDA; hf: off)
    share_prompts: Optional[bool] = False


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
    compile: Optional[bool] = None  # per-block torch.compile; null: on for CUDA (benchmarks/gpu.md), off on CPU
    # sdpa | flex (flex has no backward on CPU); null: flex where prompts are shared on CUDA, else sdpa
    attention: Optional[AttentionBackend] = None
    # null: on for CUDA, where with flex (empty blocks skipped) the one-GPU step took 1.51 s against 1.61 and 11 GiB
    # less (benchmarks/gpu.md); off on CPU (SDPA's dense mask computes every block)
    share_prompts: Optional[bool] = None
    chunk_rows: int = 4096  # rows of logits alive at once in the chunked logprobs (memory vs speed)
    param_dtype: Optional[DType] = None  # compute dtype; null: bfloat16 on GPU, float32 on CPU (weights stay float32)
    # the KL term's reference model (algorithm.beta > 0) runs in the trainer's processes on this engine: a frozen
    # copy of the initial weights, sharded, compiled and run like the policy (its weights in the compute dtype),
    # instead of a transformers model in a service of its own (services.ref_model is then unused). null: when that
    # service would share the trainer's mesh (every services= layout but three_gpu puts it there): on one GPU it
    # scored a batch in 0.16 s against the service's 0.24 (benchmarks/gpu.md), and a one-process service cannot
    # match the procs of a trainer of several
    hosts_reference: Optional[bool] = None

    def __post_init__(self) -> None:
        at_least("chunk_rows", self.chunk_rows, 1)
