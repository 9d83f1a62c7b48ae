"""`trainer=titan` as the trainer actor drives it: the TitanTrainer engine (trainers/titan.py) on every process of
the trainer's torch.distributed world, with the calls trainers/hf.py answers, so apps/grpo.py does not know which
one runs. Every call is collective: the trainer actor's processes all receive it, in the same order.

    checkpoints   <dir>/ in HF format (generators, the reference model, transformers and vLLM load it) and
                  <dir>/dcp/ the sharded weights + AdamW state (torch.distributed.checkpoint: resumes on any number of
                  trainer processes); metadata files last, by rank 0, so a checkpoint is complete once they exist
    weights       `sharded_weights` (the engine's named_full_weights): the trainer actor's ShardedWeightPublisher
                  gathers each tensor once per version (runtime/weight_sync.py); rank 0 alone holds the full snapshot
                  and pushes it
    warm start    rank 0 runs the transformers warm start (models/warmstart.py) on the same model and saves it; every
                  rank then loads it
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from forge_exp.models.checkpoint import write_manifest
from forge_exp.models.hf import DTYPES, ModelSpec
from forge_exp.rl.losses import check_loss_inputs
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers.parallel import Degrees

DCP = "dcp"  # the sharded state's subdirectory of a checkpoint


class TitanBackend:
    def __init__(
        self,
        model: ModelSpec,
        loss,
        *,
        device: torch.device,
        lr: float,
        weight_decay: float,
        loss_inputs: set[str],
        degrees: Degrees,
        init_path: str | None = None,
        resume_step: int = 0,
        activation_checkpointing: str = "none",
        compile: bool | None = None,
        attention: str | None = None,
        chunk_rows: int = 4096,
        share_prompts: bool | None = None,
        param_dtype: str | None = None,
    ):
        from forge_exp.trainers.titan import TitanTrainer

        check_loss_inputs(loss, loss_inputs)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        spec = model.loading(init_path)
        self.tokenizer = spec.tokenizer()
        self.sync_dtype = DTYPES[model.dtype]  # what moves to the generators (they hold model.dtype)
        # how the model is built and run, for the reference model too (load_reference)
        self._built = dict(degrees=degrees, device=device, param_dtype=DTYPES[param_dtype] if param_dtype else None,
                           compile=compile, attention=attention, chunk_rows=chunk_rows,
                           share_prompts=share_prompts)
        with self._hf_dir(spec) as source:
            self.trainer = TitanTrainer.from_pretrained(
                source, loss=loss, lr=lr, weight_decay=weight_decay, activation_checkpointing=activation_checkpointing,
                **self._built,
            )
        if resume_step:
            self.trainer.load(Path(init_path) / DCP)
        self.model = self.trainer.model
        self.sharded_weights = self.trainer  # named_full_weights / weight_layout: what weight sync gathers from
        self.step = resume_step
        self._model = model  # the model's own weights (the reference model's when no path is given)
        self.reference = None

    @contextlib.contextmanager
    def _hf_dir(self, spec: ModelSpec):
        """An HF directory to read the weights from (collective): the model's own, or (a randomly initialised model,
        its weights the same at every build) its weights written by rank 0 to a directory every rank reads, removed
        once all have."""
        if spec.path or getattr(spec, "hf_id", None):
            yield spec.path or _hub_dir(spec.hf_id)
            return
        with self._scratch("forge-exp-titan-") as where:
            if self.rank == 0:
                spec.build().save_pretrained(where)
            dist.barrier()
            yield where

    @contextlib.contextmanager
    def _scratch(self, prefix: str):
        """A directory rank 0 makes and every rank is told of (collective), which rank 0 removes when every rank is
        done with it (after an error it stays: the other ranks may still be reading it)."""
        where = [tempfile.mkdtemp(prefix=prefix) if self.rank == 0 else None]
        dist.broadcast_object_list(where, src=0)
        yield where[0]
        dist.barrier()
        if self.rank == 0:
            shutil.rmtree(where[0], ignore_errors=True)

    # --- the calls of trainers/hf.py ------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, *, grad_accum: int, max_grad_norm: float, temperature: float,
                   mask_truncated: bool, version: int | None = None) -> dict[str, float]:
        metrics = self.trainer.train_step(batch, grad_accum=grad_accum, max_grad_norm=max_grad_norm,
                                          temperature=temperature, mask_truncated=mask_truncated, version=version)
        self.step += 1
        return {**metrics, "trainer/world_size": float(self.world), **self._memory()}

    def load_reference(self, path: str | None) -> None:
        """The KL term's reference model in this engine (trainer.hosts_reference): a frozen copy of the weights at
        `path` (the run's initial policy; None: the model's own), sharded, compiled and run like the policy, so no
        reference service of its own holds a whole transformers copy. Its weights are stored in param_dtype (nothing
        updates them)."""
        from forge_exp.trainers.titan import TitanTrainer

        with self._hf_dir(self._model.loading(path)) as source:
            self.reference = TitanTrainer.from_pretrained(source, loss=None, lr=0.0, frozen=True, **self._built)

    def ref_logprobs(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        """[B, R] logprobs of the responses under the reference model (load_reference), on every rank."""
        return self.reference.score(batch, temperature)

    def _memory(self) -> dict[str, float]:
        """Each rank's memory (GiB): resident set and, on GPU, the allocator's peak since the last step."""
        device = self.trainer.device
        mine = [psutil.Process().memory_info().rss / 2**30]
        if device.type == "cuda":
            mine.append(torch.cuda.max_memory_allocated(device) / 2**30)
            torch.cuda.reset_peak_memory_stats(device)
        every = [None] * self.world
        dist.all_gather_object(every, mine)
        out = {f"trainer/rss_gib/rank{r}": m[0] for r, m in enumerate(every)}
        if device.type == "cuda":
            out.update({f"trainer/gpu_peak_gib/rank{r}": m[1] for r, m in enumerate(every)})
        return out

    def warm_start(self, items: list, steps: int, lr: float, batch_size: int,
                   target_accuracy: float | None, seed: int, directory: str) -> dict[str, float]:
        """The warm start of the model in place, saved in HF format to `directory`."""
        from forge_exp.data.tool_arithmetic import warmstart_inputs
        from forge_exp.models.warmstart import warmstart

        metrics = {}
        hf = _hf_model_of(self)  # collective: every rank takes part in gathering the weights
        with self._scratch("forge-exp-warm-") as where:
            if self.rank == 0:
                metrics = warmstart(hf, self.tokenizer, **warmstart_inputs(items, seed), steps=steps, lr=lr,
                                    batch_size=batch_size, target_accuracy=target_accuracy)
                hf.save_pretrained(where)
            dist.barrier()
            self.trainer.load_hf(where)
        self.save(directory, optimizer=False)
        return metrics

    def save(self, directory: str, metadata: dict | None = None, optimizer: bool = True) -> str:
        path = self.trainer.save_hf(directory, self.tokenizer)
        dist.barrier()
        if optimizer:
            self.trainer.save(Path(path) / DCP)
        dist.barrier()
        if self.rank == 0:
            for name, obj in (metadata or {}).items():
                (Path(path) / name).write_text(json.dumps(obj, indent=2, sort_keys=True))
            write_manifest(path)  # last: the sizes and hashes a resume checks (models/checkpoint.py)
        dist.barrier()
        return str(path)


def _hub_dir(hf_id: str) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(hf_id, local_files_only=True)


def _hf_model_of(backend: TitanBackend):
    """A transformers model holding the engine's current (full) weights, on rank 0; None on the others. Collective:
    every rank takes part in gathering each tensor."""
    from transformers import AutoConfig, AutoModelForCausalLM

    weights = {name: t.cpu() for name, t in backend.trainer.named_full_weights()}
    if backend.rank != 0:
        return None
    config = AutoConfig.for_model(**backend.trainer.hf_config)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(weights, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model
