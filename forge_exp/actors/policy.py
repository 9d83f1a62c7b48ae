"""The policy a training actor owns: model, tokenizer, optimizer and loss, built the same way for GRPO and SFT.

Master weights: the model trains in float32 even when `model.dtype` is bfloat16/float16 (the forward then runs under
autocast in that dtype). AdamW's updates at RL learning rates (~1e-6 relative) are below bf16's resolution, so a
bf16 copy of the weights would not move; generators and the reference model still hold `model.dtype`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from forge_exp.actors.placement import place
from forge_exp.config.algorithm import AlgorithmConfig, build_loss
from forge_exp.config.model import ModelConfig, build_model
from forge_exp.models.checkpoint import OPTIMIZER
from forge_exp.models.hf import DTYPES
from forge_exp.rl.losses import check_loss_inputs
from forge_exp.rl.update import Policy


def load_policy(
    model: ModelConfig,
    algorithm: AlgorithmConfig,
    init_path: str | None,
    seed: int,
    resume_step: int,
    loss_inputs: set[str],
    devices: list[list[str]],
    threads: int,
) -> Policy:
    """Place the actor, load the weights (init_path: a warm start or a checkpoint), build loss and AdamW; when
    resuming (resume_step > 0) init_path is the checkpoint and its optimizer state is restored too."""
    device = place(devices, threads, seed)
    compute_dtype = DTYPES[model.dtype]
    net, tokenizer = build_model(replace(model, path=init_path or model.path, dtype="float32"), device)
    loss = build_loss(algorithm.loss)
    check_loss_inputs(loss, loss_inputs)
    optimizer = torch.optim.AdamW(
        net.parameters(), lr=algorithm.lr, weight_decay=algorithm.weight_decay, betas=(0.9, 0.99)
    )
    if resume_step:
        optimizer.load_state_dict(torch.load(f"{init_path}/{OPTIMIZER}", map_location=device))
    return Policy(device, net, tokenizer, optimizer, loss, compute_dtype)
