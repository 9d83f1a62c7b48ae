"""Everything that can be checked before a process starts: schema, ranges, targets, weights, GPUs."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from forge_exp.config.run import ForgeConfig


def validate(cfg: DictConfig) -> ForgeConfig:
    """The typed config, or a ValueError whose one-line message names the offending key."""
    try:
        config: ForgeConfig = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ValueError(_one_line(e)) from None
    check_runtime(config)
    return config


def check_runtime(config: ForgeConfig) -> None:
    """Checks that need more than the schema: the loss and rewards build, the weights exist, the GPUs exist."""
    import torch

    from forge_exp.config.algorithm import build_loss
    from forge_exp.models.hf import check_model_available
    from forge_exp.rewards.combine import build_reward
    from forge_exp.rl.losses import check_loss_inputs
    from forge_exp.rl.update import available_inputs
    from forge_exp.runtime.layout import check_gpus, needed_services, plan_meshes

    loss = build_loss(config.algorithm.loss)
    check_loss_inputs(loss, available_inputs(config.algorithm.beta))
    build_reward(config.reward.functions)
    check_model_available(config.model)
    meshes = plan_meshes(config.services, needed_services(config.algorithm.beta))
    check_gpus(meshes, torch.cuda.device_count() if torch.cuda.is_available() else 0)


def _one_line(e: OmegaConfBaseException) -> str:
    cause = e.__cause__ or e.__context__
    msg = str(cause) if isinstance(cause, ValueError) else str(e)
    first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
    key = getattr(e, "full_key", None)
    if key and key not in first:
        first = f"{key}: {first}"
    return first
