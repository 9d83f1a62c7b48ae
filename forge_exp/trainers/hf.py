"""`trainer=hf`: one process holds the whole transformers model and its optimizer.

Master weights: the model trains in float32 even when `model.dtype` is bfloat16/float16 (the forward then runs
under autocast in that dtype). AdamW's updates at RL learning rates (~1e-6 relative) are below bf16's resolution,
so a bf16 copy of the weights would not move; generators and the reference model still hold `model.dtype`.

The trainer actor (actors/trainer.py) builds one through `_target_` and calls: `train_step` (GRPO family,
trainers/update.py), `sft_step` / `sft_eval` (trainers/sft.py), `warm_start`, `save`, and publishes `model`'s weights.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from forge_exp.data.tool_arithmetic import warmstart_inputs
from forge_exp.models.checkpoint import OPTIMIZER, save_hf_checkpoint
from forge_exp.models.hf import DTYPES, ModelSpec
from forge_exp.models.warmstart import warmstart
from forge_exp.rl.losses import check_loss_inputs
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers.update import Policy, policy_update
from forge_exp.trainers.sft import SFT_INPUTS, sft_eval, sft_update  # noqa: F401 — SFT_INPUTS: preflight's


class HFTrainer:
    def __init__(
        self,
        model: ModelSpec,
        loss,
        *,
        device: torch.device,
        lr: float,
        weight_decay: float,
        loss_inputs: set[str],
        init_path: str | None = None,
        resume_step: int = 0,
    ):
        """Load the weights (init_path: a warm start or a checkpoint, else the model's own), build AdamW; when
        resuming (resume_step > 0) init_path is the checkpoint and its optimizer state is restored too."""
        check_loss_inputs(loss, loss_inputs)
        spec = model.loading(init_path)
        net = spec.build(device, dtype="float32")
        self.tokenizer = spec.tokenizer()

        def adamw() -> torch.optim.AdamW:
            # fused: one kernel over every parameter instead of ~10 ops per tensor (the same update; ~1 ms of a tiny
            # model's ~60 ms step on one CPU thread)
            optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99),
                                          fused=device.type in ("cpu", "cuda"))
            if resume_step:
                state = torch.load(f"{init_path}/{OPTIMIZER}", map_location=device, weights_only=True)
                optimizer.load_state_dict(state)
            return optimizer

        # Built on a thread: a process's first torch.optim call imports torch._dynamo (1-2 s of CPU on 2 cores),
        # which the first weight push, evaluation and rollout then overlap instead of waiting for. Resuming waits
        # for it here, so that a bad optimizer file fails the start.
        pool = ThreadPoolExecutor(1, thread_name_prefix="optimizer")
        self._optimizer = pool.submit(adamw)
        pool.shutdown(wait=False)
        if resume_step:
            self._optimizer.result()
        self.device, self.loss, self.compute_dtype = device, loss, DTYPES[model.dtype]
        self.model = net
        self.step = resume_step
        self.schedule = None
        self.rank = 0  # one process: it answers every call and pushes the weights

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self._optimizer.result()

    @functools.cached_property
    def policy(self) -> Policy:  # at the first training step: it holds the optimizer
        return Policy(self.device, self.model, self.tokenizer, self.optimizer, self.loss, self.compute_dtype)

    # --- GRPO family ------------------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, *, grad_accum: int, max_grad_norm: float, temperature: float,
                   mask_truncated: bool) -> dict[str, float]:
        metrics = policy_update(self.policy, batch, grad_accum=grad_accum, max_grad_norm=max_grad_norm,
                                temperature=temperature, mask_truncated=mask_truncated)
        self.step += 1
        return metrics

    # --- SFT --------------------------------------------------------------------------------------------------
    def lr_schedule(self, warmup_steps: int, total_steps: int) -> None:
        """Linear warm-up, then cosine decay to 10% of lr at total_steps (transformers' schedule); a resumed run
        continues the schedule at its step."""
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])  # what a scheduler started mid-way scales
        self.schedule = get_cosine_with_min_lr_schedule_with_warmup(
            self.optimizer, warmup_steps, total_steps, min_lr_rate=0.1, last_epoch=self.step - 1
        )

    def sft_step(self, batch, *, grad_accum: int, max_grad_norm: float) -> dict[str, float]:
        metrics = sft_update(self.model, self.optimizer, self.loss, batch, grad_accum=grad_accum,
                             max_grad_norm=max_grad_norm)
        if self.schedule is not None:
            self.schedule.step()
        self.step += 1
        return metrics

    def sft_eval(self, batches) -> dict[str, float]:
        return sft_eval(self.model, batches)

    # --- warm start, checkpoints ------------------------------------------------------------------------------
    def warm_start(self, items: list, steps: int, lr: float, batch_size: int,
                   target_accuracy: float | None, seed: int = 0) -> dict[str, float]:
        """On problems (one answer each) or multi-turn demonstrations (data/tool_arithmetic.py)."""
        return warmstart(self.model, self.tokenizer, **warmstart_inputs(items, seed), steps=steps, lr=lr,
                         batch_size=batch_size, target_accuracy=target_accuracy)

    def save(self, directory: str, metadata: dict | None = None, optimizer: bool = True) -> str:
        """HF-format weights + tokenizer (+ optimizer state and metadata files), written atomically."""
        return str(save_hf_checkpoint(self.model, self.tokenizer, directory, metadata,
                                      optimizer=self.optimizer if optimizer else None))
