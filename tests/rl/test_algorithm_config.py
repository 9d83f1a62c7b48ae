"""conf/algorithm/*.yaml against the AlgorithmConfig schema; build_loss; overrides reaching the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from forge_exp.config.algorithm import AlgorithmConfig, build_loss
from forge_exp.rl.losses import CISPOLoss, GRPOLoss, GSPOLoss, ReinforceLoss, SAPOLoss, call_loss, check_loss_inputs

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm"
EXPECTED = {
    "grpo": GRPOLoss, "dr_grpo": GRPOLoss, "dapo": GRPOLoss, "gspo": GSPOLoss,
    "cispo": CISPOLoss, "sapo": SAPOLoss, "reinforce": ReinforceLoss,
}


class NoKwargsLoss(nn.Module):
    def forward(self, logprobs, advantages, padding_mask):
        return -(logprobs * advantages * padding_mask).mean()


def load(name: str, *overrides: str) -> AlgorithmConfig:
    """What Hydra does: the YAML merged into the schema under `algorithm`, command-line overrides, to_object."""
    node = OmegaConf.merge(OmegaConf.structured(AlgorithmConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    root = OmegaConf.create({"dataset": {"max_new_tokens": 256}, "algorithm": node})
    root = OmegaConf.merge(root, OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_object(root.algorithm)


def small_inputs():
    g = torch.Generator().manual_seed(0)
    blp = -torch.rand(4, 6, generator=g)
    return dict(logprobs=(blp + 0.1 * torch.randn(4, 6, generator=g)).requires_grad_(True), behavior_logprobs=blp,
                ref_logprobs=blp, advantages=torch.randn(4, 1, generator=g), padding_mask=torch.ones(4, 6),
                entropy=torch.rand(4, 6, generator=g))


def test_every_algorithm_has_a_yaml():
    assert {p.stem for p in CONF.glob("*.yaml")} >= set(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_yaml_loads_builds_and_runs(name):
    cfg = load(name)
    assert isinstance(cfg, AlgorithmConfig) and cfg.name == name and cfg.max_response_len == 256
    loss = build_loss(cfg.loss)
    assert type(loss) is EXPECTED[name]
    available = {"logprobs", "behavior_logprobs", "advantages", "padding_mask", "entropy"}
    check_loss_inputs(loss, available | ({"ref_logprobs"} if cfg.beta > 0 else set()))
    value, metrics = call_loss(loss, **small_inputs())
    value.backward()
    assert torch.isfinite(value) and "loss/clip_frac_high" in metrics


def test_paper_settings_reach_the_losses():
    dapo = build_loss(load("dapo").loss)
    assert (dapo.clip_low, dapo.clip_high, dapo.agg.mode, dapo.regularizers.beta) == (0.2, 0.28, "token_mean", 0.0)
    dr = build_loss(load("dr_grpo").loss)
    assert (dr.agg.mode, dr.agg.horizon) == ("fixed_horizon", 256) and load("dr_grpo").advantage == "mean"
    grpo = build_loss(load("grpo").loss)
    assert (grpo.regularizers.beta, grpo.regularizers.kl_estimator, grpo.agg.mode) == (0.04, "k3", "seq_mean")
    assert build_loss(load("cispo").loss).clip_low is None
    assert load("dapo").overlong_buffer_len == 256 // 5  # null → a fifth of max_response_len
    assert load("dapo", "algorithm.overlong_buffer=64").overlong_buffer_len == 64


def test_command_line_overrides_reach_the_loss():
    loss = build_loss(load("grpo", "algorithm.clip_high=0.28", "algorithm.beta=0.1", "algorithm.dual_clip=3.0").loss)
    assert (loss.clip_high, loss.regularizers.beta, loss.dual_clip) == (0.28, 0.1, 3.0)
    sapo = build_loss(load("sapo", "algorithm.tau_neg=2.0").loss)
    assert sapo.tau_neg == 2.0
    assert build_loss(load("gspo", "algorithm.gspo_token=true").loss).token_level is True


def test_target_swap():
    """`algorithm.loss._target_=my.Loss` alone plugs in a loss that takes none of the routed knobs; the knobs it
    does declare still reach it; a keyword that is not a routed knob is still refused."""
    target = f"{__name__}.NoKwargsLoss"
    cfg = load("grpo", f"algorithm.loss._target_={target}")
    assert "beta" in cfg.loss and "clip_low" in cfg.loss  # the node still carries grpo's interpolated knobs
    loss = build_loss(cfg.loss)
    assert isinstance(loss, NoKwargsLoss)
    value, metrics = call_loss(loss, **small_inputs())
    assert value.dim() == 0 and metrics == {}
    cfg = load("grpo", f"algorithm.loss._target_={__name__}.BetaOnlyLoss", "algorithm.beta=0.3")
    assert build_loss(cfg.loss).beta == 0.3
    with pytest.raises(ValueError, match=r"^algorithm.loss.scale: .*NoKwargsLoss does not take scale"):
        build_loss({"_target_": target, "scale": 2.0})


class BetaOnlyLoss(nn.Module):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def forward(self, logprobs, advantages, padding_mask):
        return -(logprobs * advantages * padding_mask).sum()


def test_build_loss_errors_name_the_key():
    with pytest.raises(ValueError, match=r"^algorithm.loss._target_: cannot import 'my_losses.CustomLoss'"):
        build_loss({"_target_": "my_losses.CustomLoss"})
    with pytest.raises(ValueError, match=r"^algorithm.loss._target_: cannot import 'forge_exp.rl.losses.NoSuchLoss'"):
        build_loss({"_target_": "forge_exp.rl.losses.NoSuchLoss"})
    with pytest.raises(ValueError, match=r"^algorithm.loss.clip_hgh: forge_exp.rl.losses.GRPOLoss does not take"):
        build_loss({"_target_": "forge_exp.rl.losses.GRPOLoss", "clip_hgh": 0.28})
    with pytest.raises(ValueError, match=r"^algorithm.loss \(forge_exp.rl.losses.GRPOLoss\): clip_low must be in"):
        build_loss({"_target_": "forge_exp.rl.losses.GRPOLoss", "clip_low": 1.5})
    with pytest.raises(ValueError, match=r"^algorithm.loss is not set"):
        build_loss(None)
    with pytest.raises(ValueError, match=r"^algorithm.loss._target_ must be"):
        build_loss({"clip_low": 0.2})


def test_build_loss_accepts_a_dictconfig_and_partial_functions():
    node = OmegaConf.create({"_target_": "forge_exp.rl.losses.SAPOLoss", "tau_pos": 0.5})
    assert build_loss(node).tau_pos == 0.5
    fn = build_loss({"_target_": "torch.nn.functional.mse_loss", "_partial_": True, "reduction": "sum"})
    assert fn.keywords == {"reduction": "sum"}


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.clip_low=1.2", "algorithm.clip_low must be in [0, 1) or null, got 1.2"),
        ("algorithm.clip_high=-0.1", "algorithm.clip_high must be >= 0"),
        ("algorithm.dual_clip=1.0", "algorithm.dual_clip must be > 1"),
        ("algorithm.group_size=1", "algorithm.group_size must be >= 2"),
        ("algorithm.prompts_per_step=0", "algorithm.prompts_per_step must be >= 1"),
        ("algorithm.lr=0", "algorithm.lr must be > 0"),
        ("algorithm.weight_decay=-1", "algorithm.weight_decay must be >= 0"),
        ("algorithm.max_grad_norm=0", "algorithm.max_grad_norm must be > 0"),
        ("algorithm.grad_accum=0", "algorithm.grad_accum must be >= 1"),
        ("algorithm.beta=-0.1", "algorithm.beta must be >= 0"),
        ("algorithm.kl_estimator=k4", "algorithm.kl_estimator must be one of k1, k2, k3"),
        ("algorithm.loss_agg=mean", "algorithm.loss_agg must be one of"),
        ("algorithm.advantage=std", "algorithm.advantage must be one of"),
        ("algorithm.temperature=0", "algorithm.temperature must be > 0 (0 is greedy decoding"),
        ("algorithm.top_p=0", "algorithm.top_p must be in (0, 1]"),
        ("algorithm.top_p=1.5", "algorithm.top_p must be in (0, 1]"),
        ("algorithm.max_policy_age=-1", "algorithm.max_policy_age must be >= 0"),
        ("algorithm.max_sampling_attempts=0", "algorithm.max_sampling_attempts must be >= 1"),
        ("algorithm.tau_pos=0", "algorithm.tau_pos must be > 0"),
        ("algorithm.ratio_cap=0", "algorithm.ratio_cap must be > 0"),
        ("algorithm.overlong_buffer=1000", "algorithm.overlong_buffer must be in [1, algorithm.max_response_len=256]"),
        ("algorithm.overlong_buffer=0", "algorithm.overlong_buffer must be in [1, algorithm.max_response_len=256]"),
        ("algorithm.max_response_len=0", "algorithm.max_response_len must be >= 1"),
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    with pytest.raises(ValueError) as e:
        load("dapo", override)
    assert str(e.value).startswith(key)


def test_typos_and_wrong_types_fail_in_the_schema():
    from omegaconf.errors import ConfigKeyError, ValidationError

    with pytest.raises(ConfigKeyError):
        load("grpo", "algorithm.clip_hgh=0.28")
    with pytest.raises(ValidationError):
        load("grpo", "algorithm.group_size=eight")


def test_dataclass_defaults_are_valid_and_loss_node_is_checked():
    assert AlgorithmConfig().loss is None
    with pytest.raises(ValueError, match="^algorithm.loss must be a mapping with _target_"):
        AlgorithmConfig(loss={"clip_low": 0.2})
