"""The loss contract (forge_exp/rl/losses/__init__.py): losses ask for inputs by name; call_loss passes only
those and normalises the return; check_loss_inputs fails at start-up with one clear line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from forge_exp.rl.losses import (
    CISPOLoss,
    GRPOLoss,
    GSPOLoss,
    ReinforceLoss,
    SAPOLoss,
    call_loss,
    check_loss_inputs,
    loss_inputs,
)

TRAINER_INPUTS = {"logprobs", "behavior_logprobs", "advantages", "padding_mask", "entropy"}  # beta = 0


class TorchforgeStyleLoss(nn.Module):
    """The shape of torchforge's SimpleGRPOLoss: on-policy ratio, k3 KL, scalar out."""

    def __init__(self, beta: float = 0.1):
        super().__init__()
        self.beta = beta

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask):
        kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
        per_token = -(torch.exp(logprobs - logprobs.detach()) * advantages - self.beta * kl)
        return ((per_token * padding_mask).sum(1) / padding_mask.sum(1).clamp(min=1)).mean()


class OldLogprobsLoss(nn.Module):
    def forward(self, logprobs, old_logprobs, advantages, padding_mask):
        ratio = torch.exp(logprobs - old_logprobs)
        return -(ratio * advantages * padding_mask).sum() / padding_mask.sum(), {"custom/ratio": ratio.mean().detach()}


def inputs(B=3, T=4, ref=True):
    g = torch.Generator().manual_seed(0)
    blp = -torch.rand(B, T, generator=g)
    out = dict(
        logprobs=(blp + 0.1 * torch.randn(B, T, generator=g)).requires_grad_(True),
        behavior_logprobs=blp,
        advantages=torch.randn(B, 1, generator=g),
        padding_mask=torch.ones(B, T),
        entropy=torch.rand(B, T, generator=g),
    )
    if ref:
        out["ref_logprobs"] = blp + 0.05
    return out


def test_torchforge_style_loss_plugs_in_unchanged():
    loss = TorchforgeStyleLoss()
    assert loss_inputs(loss) == {"logprobs", "ref_logprobs", "advantages", "padding_mask"}
    check_loss_inputs(loss, TRAINER_INPUTS | {"ref_logprobs"})
    x = inputs()
    value, metrics = call_loss(loss, **x)  # behavior_logprobs and entropy are offered but not passed
    expected = loss(x["logprobs"], x["ref_logprobs"], x["advantages"], x["padding_mask"])
    assert metrics == {} and torch.equal(value, expected)
    value.backward()
    assert x["logprobs"].grad is not None


def test_torchforge_style_loss_without_reference_fails_clearly():
    with pytest.raises(ValueError) as e:
        check_loss_inputs(TorchforgeStyleLoss(), TRAINER_INPUTS)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("algorithm.loss (")
    assert "asks for ref_logprobs, which exists only when algorithm.beta > 0" in msg
    with pytest.raises(ValueError, match="ref_logprobs"):  # call_loss checks too; None counts as absent
        call_loss(TorchforgeStyleLoss(), **{**inputs(), "ref_logprobs": None})


def test_old_logprobs_alias_gets_the_behaviour_logprobs():
    loss = OldLogprobsLoss()
    assert loss_inputs(loss) == {"logprobs", "behavior_logprobs", "advantages", "padding_mask"}
    x = inputs(ref=False)
    value, metrics = call_loss(loss, **x)
    ratio = torch.exp(x["logprobs"] - x["behavior_logprobs"])
    torch.testing.assert_close(metrics["custom/ratio"], ratio.mean().detach())
    # callers may also offer the alias name
    value2, _ = call_loss(loss, **{("old_logprobs" if k == "behavior_logprobs" else k): v for k, v in x.items()})
    torch.testing.assert_close(value, value2)


def test_plain_function_and_kwargs_losses():
    def fn(logprobs, advantages, padding_mask):
        return -(logprobs * advantages * padding_mask).mean()

    assert loss_inputs(fn) == {"logprobs", "advantages", "padding_mask"}
    value, metrics = call_loss(fn, **inputs())
    assert value.dim() == 0 and metrics == {}

    def takes_all(logprobs, **rest):
        assert set(rest) == {"behavior_logprobs", "advantages", "padding_mask", "entropy", "ref_logprobs"}
        return logprobs.sum()

    call_loss(takes_all, **inputs())


def test_unknown_input_and_bad_returns_fail_clearly():
    def wants_values(logprobs, values):
        return logprobs.sum()

    with pytest.raises(ValueError, match="asks for 'values', which is not a loss input"):
        check_loss_inputs(wants_values, TRAINER_INPUTS)

    def per_row(logprobs, padding_mask):
        return (logprobs * padding_mask).sum(-1)

    with pytest.raises(ValueError, match=r"returned \[3\]; a loss returns a scalar"):
        call_loss(per_row, **inputs())


@pytest.mark.parametrize("loss", [GRPOLoss(beta=0.04), GRPOLoss(beta=0.0, entropy_coef=0.01), GSPOLoss(beta=0.1),
                                  CISPOLoss(), SAPOLoss(), ReinforceLoss()], ids=lambda l: type(l).__name__)
def test_builtins_declare_what_they_need(loss):
    need = loss_inputs(loss)
    assert {"logprobs", "behavior_logprobs", "advantages", "padding_mask"} <= need
    assert ("ref_logprobs" in need) == (loss.regularizers.beta > 0)
    assert ("entropy" in need) == (loss.regularizers.entropy_coef != 0)
    if "ref_logprobs" in need:
        with pytest.raises(ValueError, match="which exists only when algorithm.beta > 0"):
            check_loss_inputs(loss, TRAINER_INPUTS)
    check_loss_inputs(loss, TRAINER_INPUTS | {"ref_logprobs"})
    value, metrics = call_loss(loss, **inputs())
    assert value.dim() == 0
    for key in ("loss/policy", "loss/kl", "loss/entropy", "loss/clip_frac_low", "loss/clip_frac_high",
                "loss/clip_frac_dual", "loss/ratio_mean", "loss/ratio_max", "loss/token_frac"):
        assert metrics[key].dim() == 0 and not metrics[key].requires_grad, key


def test_metrics_report_kl_and_entropy_even_with_zero_coefficients():
    x = inputs()
    _, m = call_loss(GRPOLoss(beta=0.0), **x)  # ref_logprobs and entropy offered: measured, not optimised
    assert float(m["loss/kl"]) > 0 and float(m["loss/entropy"]) > 0
