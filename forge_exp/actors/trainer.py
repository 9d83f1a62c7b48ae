"""Trainer service: owns the policy weights and the optimizer; publishes each new version to the generators."""

from __future__ import annotations

import time

from monarch.actor import Actor, endpoint

from forge_exp.actors.policy import load_policy
from forge_exp.config.algorithm import AlgorithmConfig
from forge_exp.config.model import ModelConfig
from forge_exp.models.checkpoint import save_hf_checkpoint
from forge_exp.models.warmstart import warmstart
from forge_exp.rl.types import TrainBatch
from forge_exp.rl.update import available_inputs, policy_update
from forge_exp.runtime.weight_sync import WeightPublisher, push


class Trainer(Actor):
    def __init__(
        self,
        model: ModelConfig,
        algorithm: AlgorithmConfig,
        init_path: str | None,
        seed: int,
        resume_step: int = 0,
        *,
        devices,
        threads,
    ):
        self.policy = load_policy(
            model, algorithm, init_path, seed, resume_step, available_inputs(algorithm.beta), devices, threads
        )
        self.model, self.tokenizer, self.optimizer = self.policy.model, self.policy.tokenizer, self.policy.optimizer
        self.algorithm = algorithm
        self.version = resume_step

    @endpoint
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        a = self.algorithm
        metrics = policy_update(
            self.policy,
            batch,
            grad_accum=a.grad_accum,
            max_grad_norm=a.max_grad_norm,
            temperature=a.temperature,
            mask_truncated=a.overlong_filter,
        )
        self.version += 1
        return {**metrics, "train/version": self.version}

    @endpoint
    async def push_weights(self, generators) -> float:
        """Publish the current weights (version self.version) to every generator replica and wait until each holds
        a snapshot; returns seconds taken. runtime/weight_sync.py picks the path: a process-local copy, CUDA IPC,
        or CPU tensors in the message."""
        t0 = time.perf_counter()
        if getattr(self, "_publisher", None) is None:  # made on the first push: it holds the shared GPU buffer
            self._publisher = WeightPublisher(self.model)
        await push(self._publisher, generators, self.version)
        return time.perf_counter() - t0

    @endpoint
    async def warm_start(self, problems: list, ws, directory: str) -> dict:
        """Supervised warm start of the policy in place (config.run.WarmstartConfig), saved in HF format to
        `directory` for later runs."""
        metrics = warmstart(
            self.model, self.tokenizer, problems, steps=ws.steps, lr=ws.lr, batch_size=ws.batch_size,
            target_accuracy=ws.target_accuracy,
        )
        save_hf_checkpoint(self.model, self.tokenizer, directory)
        return metrics

    @endpoint
    async def save(self, directory: str, metadata: dict | None = None) -> str:
        """HF-format weights + tokenizer (+ optimizer state and metadata files), written atomically."""
        return str(save_hf_checkpoint(self.model, self.tokenizer, directory, metadata, optimizer=self.optimizer))
