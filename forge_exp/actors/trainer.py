"""Trainer service: owns the policy weights and the optimizer, through the engine `trainer=` names
(trainers/hf.py, trainers/titan_backend.py); publishes each new version to the generators. The same endpoints serve
the GRPO family (train_step) and SFT (sft_step, sft_eval): the app tells it what its loss takes and its lr schedule,
without it asking which algorithm runs. A sharded engine runs on every process of the trainer's
mesh, one torch.distributed world: each endpoint is then called on all of them (runtime/services.py: a collective
service), and the answer is rank 0's."""

from __future__ import annotations

import time

import torch
from monarch.actor import Actor, endpoint

from forge_exp.actors.placement import place
from forge_exp.rl.types import TrainBatch
from forge_exp.runtime.build import build
from forge_exp.runtime.sharded_weights import ShardedWeightPublisher
from forge_exp.runtime.weight_sync import WeightPublisher, push


def publisher_of(engine) -> WeightPublisher:
    """How an engine's weights reach the generators: a sharded engine's full tensors gathered once per version,
    or a single process's parameters as they are (with LoRA its adapters alone)."""
    sharded = getattr(engine, "sharded_weights", None)
    if sharded is not None:
        return ShardedWeightPublisher(sharded, engine.rank, sharded.device, dtype=engine.sync_dtype)
    return WeightPublisher(engine.published())


class Trainer(Actor):
    def __init__(self, trainer, model, algorithm, init_path: str | None, seed: int, inputs: set[str],
                 resume_step: int = 0, lr_schedule: tuple[int, int] | None = None, degrees=None, *, devices, threads):
        """`inputs`: what the step hands the loss (the algorithm's loss_inputs); `lr_schedule`: (warm-up steps,
        total steps) of a warm-up then cosine decay, None for a constant lr; `degrees`: the sharded engine's
        parallelism (trainers/parallel.py: Degrees), None for one process."""
        device = place(devices, threads, seed)
        self.engine = build(
            trainer, "trainer", model=build(model, "model"), loss=build(algorithm.loss, "algorithm.loss"),
            device=device, lr=algorithm.lr, weight_decay=algorithm.weight_decay, loss_inputs=inputs,
            init_path=init_path, resume_step=resume_step, **({"degrees": degrees} if trainer.collective else {}),
        )
        if lr_schedule is not None:
            self.engine.lr_schedule(*lr_schedule)
        self.algorithm = algorithm
        self.version = resume_step

    @endpoint
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step: version v → v+1 (push_weights then sends it to the generators)."""
        a = self.algorithm
        metrics = self.engine.train_step(batch, grad_accum=a.grad_accum, max_grad_norm=a.max_grad_norm,
                                         temperature=a.temperature, mask_truncated=a.overlong_filter,
                                         version=self.version)
        self.version += 1
        return {**metrics, "train/version": self.version}

    @endpoint
    async def sft_step(self, batch) -> dict[str, float]:
        a = self.algorithm
        return self.engine.sft_step(batch, grad_accum=a.grad_accum, max_grad_norm=a.max_grad_norm)

    @endpoint
    async def sft_eval(self, batches: list) -> dict[str, float]:
        return self.engine.sft_eval(batches)

    @endpoint
    async def push_weights(self, generators) -> dict[str, float]:
        """Publish the current weights (version self.version) to every generator replica and wait until each holds
        a snapshot: how long it took (sync/seconds) and how much was sent (sync/bytes), with what taking the snapshot
        reported (trainer=titan's sync/capture_seconds, part of those seconds). runtime/weight_sync.py picks the path:
        a process-local copy, CUDA IPC, shared CPU memory, or CPU tensors in the message."""
        t0 = time.perf_counter()
        if getattr(self, "_publisher", None) is None:  # made on the first push: it holds the shared buffer
            self._publisher = publisher_of(self.engine)
        captured = self._publisher.capture()  # a sharded engine: every rank takes part in gathering the full weights
        if self.engine.rank == 0:
            await push(self._publisher, generators, self.version)
        seconds, nbytes = time.perf_counter() - t0, float(self._publisher.payload_bytes)
        return {**captured, "sync/seconds": seconds, "sync/bytes": nbytes}

    @endpoint
    async def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """The reference model's [B, R] logprobs of the responses, from the trainer's own base with its adapters
        switched off (model.lora), or from the reference model the engine holds (trainer.hosts_reference): such
        a run starts no reference model of its own (actors/reference.py has the same call)."""
        return self.engine.ref_logprobs(batch, self.algorithm.temperature)

    @endpoint
    async def load_reference(self, path: str | None) -> None:
        """trainer.hosts_reference: the engine builds the reference model from `path` (the run's initial weights;
        None: the model's own)."""
        self.engine.load_reference(path)

    @endpoint
    async def warm_start(self, items: list, ws, directory: str, seed: int = 0) -> dict:
        """Supervised warm start of the policy in place (config.model.WarmstartConfig) on problems or multi-turn
        demonstrations, saved in HF format to `directory` for later runs."""
        return self.engine.warm_start(items, ws.steps, ws.lr, ws.batch_size, ws.target_accuracy, seed, directory)

    @endpoint
    async def save(self, directory: str, metadata: dict | None = None, optimizer: bool = True) -> str:
        """HF-format weights + tokenizer (+ optimizer state and metadata files), written atomically."""
        return self.engine.save(directory, metadata, optimizer)
