"""Trainer service: owns the policy weights and the optimizer; publishes each new version to the generators."""

from __future__ import annotations

import time

import torch
from monarch.actor import Actor, endpoint

from forge_exp.actors.placement import place
from forge_exp.config.algorithm import AlgorithmConfig, build_loss
from forge_exp.config.model import ModelConfig, build_model
from forge_exp.models.checkpoint import OPTIMIZER, save_hf_checkpoint
from forge_exp.models.warmstart import warmstart
from forge_exp.rl.losses import check_loss_inputs
from forge_exp.rl.types import TrainBatch
from forge_exp.rl.update import available_inputs, policy_update


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
        self.device = place(devices, threads, seed)
        if init_path:
            model = ModelConfig(**{**model.__dict__, "path": init_path})
        self.model, self.tokenizer = build_model(model, self.device)
        self.algorithm = algorithm
        self.loss = build_loss(algorithm.loss)
        check_loss_inputs(self.loss, available_inputs(algorithm.beta))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=algorithm.lr, weight_decay=algorithm.weight_decay, betas=(0.9, 0.99)
        )
        self.version = resume_step
        if resume_step:  # init_path is the checkpoint: restore the optimizer too
            self.optimizer.load_state_dict(torch.load(f"{init_path}/{OPTIMIZER}", map_location=self.device))

    @endpoint
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        a = self.algorithm
        metrics = policy_update(
            self.model,
            self.optimizer,
            self.loss,
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
        """Send the current weights (version self.version) to every generator replica; returns seconds taken."""
        t0 = time.perf_counter()
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        await generators.receive_weights.call(self.version, state)
        return time.perf_counter() - t0

    @endpoint
    async def warm_start(self, problems: list, steps: int, lr: float, batch_size: int, directory: str) -> dict:
        """Supervised warm start of the policy in place, saved (HF format) to `directory` for later runs."""
        t0 = time.perf_counter()
        metrics = warmstart(self.model, self.tokenizer, problems, steps=steps, lr=lr, batch_size=batch_size)
        save_hf_checkpoint(self.model, self.tokenizer, directory)
        return {**metrics, "warmstart/seconds": time.perf_counter() - t0}

    @endpoint
    async def save(self, directory: str, metadata: dict | None = None) -> str:
        """HF-format weights + tokenizer (+ optimizer state and metadata files), written atomically."""
        return str(save_hf_checkpoint(self.model, self.tokenizer, directory, metadata, optimizer=self.optimizer))
