"""conf/algorithm/*.yaml build their losses through `_target_`; overrides (and their short aliases) reach the loss;
a swapped-in loss receives only the knobs it declares."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from forge_exp.config.algorithm import RLAlgorithm
from forge_exp.rl.losses import CISPOLoss, GRPOLoss, GSPOLoss, ReinforceLoss, SAPOLoss, call_loss, check_loss_inputs
from forge_exp.runtime.build import build
from tests.config.helpers import compose_cfg

EXPECTED = {
    "grpo": GRPOLoss, "dr_grpo": GRPOLoss, "dapo": GRPOLoss, "gspo": GSPOLoss,
    "cispo": CISPOLoss, "sapo": SAPOLoss, "reinforce": ReinforceLoss,
}


class NoKwargsLoss(nn.Module):
    def forward(self, logprobs, advantages, padding_mask):
        return -(logprobs * advantages * padding_mask).mean()


class BetaOnlyLoss(nn.Module):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def forward(self, logprobs, advantages, padding_mask):
        return -(logprobs * advantages * padding_mask).sum()


def load(name: str, *overrides: str) -> RLAlgorithm:
    """The algorithm as the CLI composes it with a real model (no tiny-model specialisation), max_new_tokens 256."""
    cfg = compose_cfg(f"algorithm={name}", "model=qwen3_0_6b", "dataset.max_new_tokens=256", *overrides)
    return OmegaConf.to_object(cfg).algorithm


def loss_of(name: str, *overrides: str):
    return build(load(name, *overrides).loss, "algorithm.loss")


def small_inputs():
    g = torch.Generator().manual_seed(0)
    blp = -torch.rand(4, 6, generator=g)
    return dict(logprobs=(blp + 0.1 * torch.randn(4, 6, generator=g)).requires_grad_(True), behavior_logprobs=blp,
                ref_logprobs=blp, advantages=torch.randn(4, 1, generator=g), padding_mask=torch.ones(4, 6),
                entropy=torch.rand(4, 6, generator=g))


@pytest.mark.parametrize("name", EXPECTED)
def test_yaml_loads_builds_and_runs(name):
    cfg = load(name)
    assert isinstance(cfg, RLAlgorithm) and cfg.name == name and cfg.loss.horizon == 256
    loss = build(cfg.loss, "algorithm.loss")
    assert type(loss) is EXPECTED[name]
    available = {"logprobs", "behavior_logprobs", "advantages", "padding_mask", "entropy"}
    check_loss_inputs(loss, available | ({"ref_logprobs"} if cfg.beta > 0 else set()))
    value, metrics = call_loss(loss, **small_inputs())
    value.backward()
    assert torch.isfinite(value) and "loss/clip_frac_high" in metrics


def test_paper_settings_reach_the_losses():
    dapo = loss_of("dapo")
    assert (dapo.options.clip_low, dapo.options.clip_high) == (0.2, 0.28)
    assert (dapo.agg.mode, dapo.regularizers.beta) == ("token_mean", 0.0)
    dr = loss_of("dr_grpo")
    assert (dr.agg.mode, dr.agg.horizon) == ("fixed_horizon", 256) and load("dr_grpo").advantage.value == "mean"
    grpo = loss_of("grpo")
    assert (grpo.regularizers.beta, grpo.regularizers.kl_estimator, grpo.agg.mode) == (0.04, "k3", "seq_mean")
    assert loss_of("cispo").options.clip_low is None
    assert load("dapo").overlong_buffer_len(256) == 256 // 5  # null → a fifth of max_new_tokens
    assert load("dapo", "algorithm.overlong_buffer=64").overlong_buffer_len(256) == 64


def test_command_line_overrides_and_aliases_reach_the_loss():
    loss = loss_of("grpo", "algorithm.clip_high=0.28", "algorithm.loss.beta=0.1", "algorithm.dual_clip=3.0")
    assert (loss.options.clip_high, loss.regularizers.beta, loss.options.dual_clip) == (0.28, 0.1, 3.0)
    assert loss_of("sapo", "algorithm.tau_neg=2.0").options.tau_neg == 2.0
    assert loss_of("gspo", "algorithm.token_level=true").options.token_level is True
    loss = loss_of("reinforce", "algorithm.rollout_correction=tis", "algorithm.rollout_cap=3")
    assert (loss.correction.mode, loss.correction.c) == ("tis", 3.0)
    seq = loss_of("gspo", "algorithm.loss.rollout_correction=seq_mask").correction
    assert (seq.mode, seq.c, seq.per_sequence) == ("seq_mask", 1.001, True)  # the mode's own cap when null
    assert loss_of("grpo").correction.mode == "none"


def test_target_swap():
    """`algorithm.loss._target_=my.Loss` alone plugs in a loss that takes none of the schema's knobs; the knobs it
    does declare still reach it; a keyword the schema does not have is still refused."""
    cfg = load("grpo", f"algorithm.loss._target_={__name__}.NoKwargsLoss")
    loss = build(cfg.loss, "algorithm.loss")
    assert isinstance(loss, NoKwargsLoss)
    value, metrics = call_loss(loss, **small_inputs())
    assert value.dim() == 0 and metrics == {}
    cfg = load("grpo", f"algorithm.loss._target_={__name__}.BetaOnlyLoss", "algorithm.beta=0.3")
    assert build(cfg.loss, "algorithm.loss").beta == 0.3
    with pytest.raises(ValueError, match=r"^algorithm.loss.scale: .*NoKwargsLoss takes no argument 'scale'"):
        build({"_target_": f"{__name__}.NoKwargsLoss", "scale": 2.0}, "algorithm.loss")


def test_build_errors_name_the_key():
    with pytest.raises(ValueError, match=r"^algorithm.loss._target_: cannot import 'my_losses.CustomLoss'"):
        build({"_target_": "my_losses.CustomLoss"}, "algorithm.loss")
    with pytest.raises(ValueError, match=r"^algorithm.loss._target_: cannot import 'forge_exp.rl.losses.NoSuch"):
        build({"_target_": "forge_exp.rl.losses.NoSuchLoss"}, "algorithm.loss")
    with pytest.raises(ValueError, match=r"^algorithm.loss.clip_hgh: forge_exp.rl.losses.GRPOLoss takes no argument "
                                         r"'clip_hgh' \(did you mean 'clip_high'\?\)"):
        build({"_target_": "forge_exp.rl.losses.GRPOLoss", "clip_hgh": 0.28}, "algorithm.loss")
    with pytest.raises(ValueError, match=r"^algorithm.loss._target_ must be"):
        build({"clip_low": 0.2}, "algorithm.loss")
    with pytest.raises(ValueError, match=r"^algorithm.loss: .*BetaOnlyLoss needs beta"):
        build({"_target_": f"{__name__}.BetaOnlyLoss"}, "algorithm.loss")


def test_build_accepts_a_dictconfig_and_partial_functions():
    node = OmegaConf.create({"_target_": "forge_exp.rl.losses.SAPOLoss", "tau_pos": 0.5})
    assert build(node, "algorithm.loss").options.tau_pos == 0.5
    fn = build({"_target_": "torch.nn.functional.mse_loss", "reduction": "sum"}, "algorithm.loss", partial=True)
    assert fn.keywords == {"reduction": "sum"}


def test_overlong_buffer_fits_in_the_response_budget():
    from forge_exp.config.validate import ConfigError, validate

    with pytest.raises(ConfigError, match=r"^algorithm\.overlong_buffer must be <= dataset\.max_new_tokens=256"):
        validate(compose_cfg("algorithm=dapo", "dataset.max_new_tokens=256", "algorithm.overlong_buffer=1000"))


def test_overlong_buffer_of_a_multi_turn_run_fits_in_its_episode_budget():
    """A multi-turn run penalizes against the whole episode's budget (env.max_total_tokens, what apps/grpo.py passes
    as L_max), not one completion's dataset.max_new_tokens."""
    from forge_exp.config.validate import ConfigError, validate

    tools = ("experiment=tool_arithmetic", "dataset.max_new_tokens=8", "env.max_total_tokens=64")
    config = validate(compose_cfg(*tools, "algorithm.overlong_penalty=true", "algorithm.overlong_buffer=32"))
    assert config.env.response_budget(config.dataset) == 64 and config.algorithm.overlong_buffer == 32
    with pytest.raises(ConfigError, match=r"^algorithm\.overlong_buffer must be <= env\.max_total_tokens=64 "):
        validate(compose_cfg(*tools, "algorithm.overlong_buffer=65"))


def test_typos_and_wrong_types_fail_at_compose_time():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="clip_hgh"):
        load("grpo", "algorithm.loss.clip_hgh=0.28")
    with pytest.raises(ConfigCompositionException, match="group_size"):
        load("grpo", "algorithm.group_size=eight")
