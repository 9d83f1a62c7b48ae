"""`trainer=hf`: one process holds the whole transformers model and its optimizer.

Master weights: the model trains in float32 even when `model.dtype` is bfloat16/float16 (the forward then runs
under autocast in that dtype). AdamW's updates at RL learning rates (~1e-6 relative) are below bf16's resolution,
so a bf16 copy of the weights would not move; generators and the reference model still hold `model.dtype`.

LoRA (`model.lora.rank` set; models/lora.py): the base is frozen in `model.dtype` (bf16 for the released models)
and `model` is a peft.PeftModel whose float32 adapters alone get gradients and AdamW state; `published()` is the
adapters alone, `ref_logprobs` is the base with the adapters switched off, and `save` writes peft's adapter format.

The trainer actor (actors/trainer.py) builds one through `_target_` and calls: `train_step` (GRPO family,
trainers/update.py), `sft_step` / `sft_eval` (trainers/sft.py), `warm_start`, `save`, `ref_logprobs`, and publishes
`published()`.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from forge_exp.data.tool_arithmetic import warmstart_inputs
from forge_exp.models.checkpoint import OPTIMIZER, save_hf_checkpoint
from forge_exp.models.hf import DTYPES, ModelSpec
from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.models.lora import adapter_parameters, attach
from forge_exp.models.warmstart import warmstart
from forge_exp.rl.losses import check_loss_inputs
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers.update import Policy, autocast, policy_update
from forge_exp.trainers.sft import sft_eval, sft_update


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
        share_prompts: bool | None = False,
    ):
        """Load the weights (init_path: a warm start or a checkpoint, else the model's own), build AdamW; when
        resuming (resume_step > 0) init_path is the checkpoint and its optimizer state is restored too.
        `share_prompts`: the rows that share a prompt run it once in a forward (models/packing.py)."""
        check_loss_inputs(loss, loss_inputs)
        spec = model.loading(init_path)
        self.lora = spec.lora_spec
        if self.lora:  # the base as the generators hold it; the adapters: fresh, or the checkpoint's to train on
            self._base_source = str(Path(spec.path).resolve()) if spec.path else getattr(spec, "hf_id", None)
            self._adapter_rng = torch.random.get_rng_state()  # every fresh adapter draws the same initialisation
            self.model = self._adapt(spec.base().build(device), spec.adapter)
        else:
            self.model = spec.build(device, dtype="float32")
        self.tokenizer = spec.tokenizer()
        self.device, self.loss, self.compute_dtype = device, loss, DTYPES[model.dtype]
        self._adamw = functools.partial(self._new_optimizer, lr, weight_decay, init_path if resume_step else None)
        self._optimizer = self._start(self._adamw)
        if resume_step:
            self._optimizer.result()
        self.step = resume_step
        self.share_prompts = bool(share_prompts)  # (null: off here)
        self.schedule = None
        self.rank = 0  # one process: it answers every call and pushes the weights

    def _new_optimizer(self, lr: float, weight_decay: float, resume_from: str | None) -> torch.optim.AdamW:
        # fused: one kernel over every parameter instead of ~10 ops per tensor (the same update; ~1 ms of a tiny
        # model's ~60 ms step on one CPU thread)
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # every one, or the adapters (LoRA)
        optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99),
                                      fused=self.device.type in ("cpu", "cuda"))
        if resume_from:
            optimizer.load_state_dict(torch.load(f"{resume_from}/{OPTIMIZER}", map_location=self.device,
                                                 weights_only=True))
        return optimizer

    @staticmethod
    def _start(make) -> Future:
        """Built on a thread: a process's first torch.optim call imports torch._dynamo (1-2 s of CPU on 2 cores),
        which the first weight push, evaluation and rollout then overlap instead of waiting for. Resuming waits
        for it, so that a bad optimizer file fails the start."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="optimizer")
        future = pool.submit(make)
        pool.shutdown(wait=False)
        return future

    def _adapt(self, base: torch.nn.Module, adapter: str | None = None) -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.random.set_rng_state(self._adapter_rng)
            return attach(base, self.lora, adapter, self._base_source)

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self._optimizer.result()

    @functools.cached_property
    def policy(self) -> Policy:  # at the first training step: it holds the optimizer
        return Policy(self.device, self.model, self.tokenizer, self.optimizer, self.loss, self.compute_dtype)

    # --- GRPO family ------------------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, *, grad_accum: int, max_grad_norm: float, temperature: float,
                   mask_truncated: bool, version: int | None = None) -> dict[str, float]:
        metrics = policy_update(self.policy, batch, grad_accum=grad_accum, max_grad_norm=max_grad_norm,
                                temperature=temperature, mask_truncated=mask_truncated, version=version,
                                share_prompts=self.share_prompts)
        self.step += 1
        return metrics

    # --- SFT --------------------------------------------------------------------------------------------------
    def lr_schedule(self, warmup_steps: int, total_steps: int) -> None:
        """Linear warm-up, then cosine decay to 10% of lr at total_steps (transformers' schedule); a resumed run
        continues the schedule at its step."""
        # imported here, for SFT alone: transformers' optimization module imports peft where it is installed
        # (~2 s of CPU), which a GRPO run's controller and trainer would pay at start-up for nothing
        from transformers import get_cosine_with_min_lr_schedule_with_warmup

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
                   target_accuracy: float | None, seed: int, directory: str) -> dict[str, float]:
        """On problems (one answer each) or multi-turn demonstrations (data/tool_arithmetic.py), saved in HF format
        to `directory`. With LoRA the whole base learns it, as without (the cache is shared); fresh adapters then
        go on the result."""
        model = self.model.unload().requires_grad_(True) if self.lora else self.model
        metrics = warmstart(model, self.tokenizer, **warmstart_inputs(items, seed), steps=steps, lr=lr,
                            batch_size=batch_size, target_accuracy=target_accuracy)
        save_hf_checkpoint(model, self.tokenizer, directory)
        if self.lora:
            model.zero_grad(set_to_none=True)  # the warm start's last gradients would count in every clipped norm
            self._base_source = str(Path(directory).resolve())
            self.model = self._adapt(model)
            self._optimizer = self._start(self._adamw)
            self.__dict__.pop("policy", None)
        return metrics

    # --- weight sync, reference model ------------------------------------------------------------------------
    def published(self) -> dict[str, torch.Tensor]:
        """What moves to the generators: every parameter, or with LoRA the adapters alone (peft's names)."""
        return adapter_parameters(self.model) if self.lora else dict(self.model.named_parameters())

    @torch.no_grad()
    def ref_logprobs(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        """[B, R] logprobs of the responses under the base model, adapters off: the reference model of a LoRA run
        (the same weights as a frozen copy of the initial policy, without the second copy)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter(), autocast(self.device, self.compute_dtype):
                lp, _ = sequence_logprobs(self.model, *(t.to(self.device) for t in (
                    batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)), temperature,
                    share_prompts=self.share_prompts)
        finally:
            self.model.train(was_training)
        return lp.cpu()

    def save(self, directory: str, metadata: dict | None = None, optimizer: bool = True) -> str:
        """HF-format weights + tokenizer (+ optimizer state and metadata files), written atomically; with LoRA the
        adapter in peft's format (adapter_config.json names its base) instead of the weights."""
        return str(save_hf_checkpoint(self.model, self.tokenizer, directory, metadata,
                                      optimizer=self.optimizer if optimizer else None))
