"""Hand-worked cases for each loss family (numbers computed by hand in the comments) and the edge cases every
built-in loss must survive: fully masked rows, zero-variance groups, a batch of one, ratios far outside the
clip range, NaN/inf inputs."""

from __future__ import annotations

import math

import pytest
import torch

from forge_exp.rl.advantages import compute_advantages
from forge_exp.rl.losses import CISPOLoss, GRPOLoss, GSPOLoss, ReinforceLoss, SAPOLoss, call_loss

F64 = torch.float64
ln = math.log


def run(loss, lp, blp, adv, mask=None, **extra):
    """→ (loss, d loss / d logprobs flattened row-major, metrics as floats) on float64 inputs given as nested lists."""
    lp = torch.tensor(lp, dtype=F64, requires_grad=True)
    blp = torch.tensor(blp, dtype=F64)
    mask = torch.ones_like(blp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    value, metrics = call_loss(loss, logprobs=lp, behavior_logprobs=blp, advantages=torch.tensor(adv, dtype=F64),
                               padding_mask=mask, **extra)
    (grad,) = torch.autograd.grad(value, lp)
    return float(value.detach()), grad.flatten().tolist(), {k: float(v) for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------- hand-worked
def test_grpo_by_hand():
    # behaviour logprobs 0, so r = exp(logprobs). ε = 0.2.
    # row 0, A = +1, r = [1.5, 0.9]: min(1.5, 1.2) = 1.2 (clipped high, grad 0);
    #   min(0.9, 0.9) = 0.9 (dL/dlp = −r·A = −0.9)
    #   row loss = −(1.2 + 0.9)/2 = −1.05
    # row 1, A = −1, r = [0.5, 1.1]: min(−0.5, −0.8) = −0.8 (clipped low, grad 0);
    #   min(−1.1, −1.1) = −1.1 (dL/dlp = +1.1)
    #   row loss = (0.8 + 1.1)/2 = 0.95
    # seq_mean = (−1.05 + 0.95)/2 = −0.05; grads are divided by |o_i| = 2 and G = 2
    v, g, m = run(GRPOLoss(beta=0.0), [[ln(1.5), ln(0.9)], [ln(0.5), ln(1.1)]], [[0, 0], [0, 0]], [[1.0], [-1.0]])
    assert v == pytest.approx(-0.05)
    assert g == pytest.approx([0.0, -0.9 / 4, 0.0, 1.1 / 4])
    assert m["loss/clip_frac_high"] == pytest.approx(0.25) and m["loss/clip_frac_low"] == pytest.approx(0.25)
    assert m["loss/token_frac"] == pytest.approx(0.5)
    assert m["loss/ratio_mean"] == pytest.approx((1.5 + 0.9 + 0.5 + 1.1) / 4)
    assert m["loss/ratio_max"] == pytest.approx(1.5)


def test_aggregations_by_hand():
    # same per-token losses with row 1's second token masked: row 0 = [−1.2, −0.9], row 1 = [0.8]
    #   seq_mean (GRPO)      = (−1.05 + 0.8)/2          = −0.125
    #   token_mean (DAPO)    = (−1.2 − 0.9 + 0.8)/3     = −0.433333
    #   fixed_horizon, L = 4 = (−1.3)/(G·L = 2·4)       = −0.1625  (Dr. GRPO)
    lp, blp, adv = [[ln(1.5), ln(0.9)], [ln(0.5), ln(1.1)]], [[0, 0], [0, 0]], [[1.0], [-1.0]]
    mask = [[True, True], [True, False]]
    expected = {"seq_mean": -0.125, "token_mean": -1.3 / 3, "fixed_horizon": -0.1625}
    for agg, value in expected.items():
        v, _, _ = run(GRPOLoss(beta=0.0, loss_agg=agg, horizon=4), lp, blp, adv, mask)
        assert v == pytest.approx(value), agg


def test_grpo_kl_term_by_hand():
    # one token, r = 1, A = 0 → policy term 0. π_θ = 0.5, π_ref = 0.25: k3 = 0.5 − ln 0.5 − 1 = 0.193147
    # loss = β·k3 = 0.1 · 0.193147; d k3 / d lp = −π_ref/π_θ + 1 = 0.5 → grad = 0.05
    ref = torch.tensor([[ln(0.25)]], dtype=F64)
    v, g, m = run(GRPOLoss(beta=0.1), [[ln(0.5)]], [[ln(0.5)]], [[0.0]], ref_logprobs=ref)
    assert v == pytest.approx(0.1 * (0.5 - ln(0.5) - 1))
    assert g == pytest.approx([0.05])
    assert m["loss/kl"] == pytest.approx(0.193147, abs=1e-6) and m["loss/policy"] == 0.0


def test_dual_clip_by_hand():
    # A = −1, r = 4, ε = 0.2, c = 3: min(−4, −1.2) = −4; max(−4, c·A = −3) = −3 → loss 3, no gradient
    v, g, m = run(GRPOLoss(beta=0.0, dual_clip=3.0), [[ln(4.0)]], [[0.0]], [[-1.0]])
    assert v == pytest.approx(3.0) and g == [0.0] and m["loss/clip_frac_dual"] == 1.0
    # without the dual clip the same token costs r·|A| = 4 with gradient +4
    v, g, _ = run(GRPOLoss(beta=0.0), [[ln(4.0)]], [[0.0]], [[-1.0]])
    assert v == pytest.approx(4.0) and g == pytest.approx([4.0])


def test_gspo_by_hand():
    # r = [2, 0.5]: mean log-ratio 0 → s = 1 (inside the clip); A = 1 → loss −1; ds/dlp_t = s/|y| = 0.5 → grad −0.5
    v, g, m = run(GSPOLoss(), [[ln(2.0), ln(0.5)]], [[0, 0]], [[1.0]])
    assert v == pytest.approx(-1.0) and g == pytest.approx([-0.5, -0.5]) and m["loss/clip_frac_high"] == 0.0
    # r = [4, 1]: s = exp((ln 4)/2) = 2 > 1 + 4e-4 → loss −(1 + 4e-4), no gradient, both tokens count as clipped
    v, g, m = run(GSPOLoss(), [[ln(4.0), 0.0]], [[0, 0]], [[1.0]])
    assert v == pytest.approx(-1.0004) and g == [0.0, 0.0] and m["loss/clip_frac_high"] == 1.0
    assert m["loss/seq_ratio_mean"] == pytest.approx(2.0) and m["loss/token_frac"] == 0.0


def test_cispo_by_hand():
    # r = [2, 0.5], A = 2, ε_high = 0.28, no lower bound → w = sg([1.28, 0.5])
    # per token −w·A·lp = [−1.28·2·ln 2, −0.5·2·(−ln 2)] = [−1.774457, 0.693147]; token mean = −0.540655
    # grad = −w·A/N = [−1.28, −0.5]: the capped token keeps its gradient
    v, g, m = run(CISPOLoss(), [[ln(2.0), ln(0.5)]], [[0, 0]], [[2.0]])
    assert v == pytest.approx((-1.28 * 2 * ln(2) + 0.5 * 2 * ln(2)) / 2)
    assert g == pytest.approx([-1.28, -0.5])
    assert m["loss/clip_frac_high"] == 0.5 and m["loss/token_frac"] == 1.0


def test_sapo_by_hand():
    # on-policy (r = 1), A = +1, τ_pos = 1: f = (4/1)·σ(0) = 2 → loss −2; f'(1) = 4·σ(0)(1−σ(0)) = 1 → grad −1
    v, g, m = run(SAPOLoss(), [[-1.0]], [[-1.0]], [[1.0]])
    assert v == pytest.approx(-2.0) and g == pytest.approx([-1.0]) and m["loss/sapo_gate_mean"] == pytest.approx(1.0)
    # r = 1, A = −1, τ_neg = 2: f = (4/2)·σ(0) = 1 → loss +1; grad = −A·4σ(1−σ)·r = +1
    v, g, _ = run(SAPOLoss(tau_neg=2.0), [[-1.0]], [[-1.0]], [[-1.0]])
    assert v == pytest.approx(1.0) and g == pytest.approx([1.0])
    # r = 2, A = +1, τ = 1: σ(1) = 0.731059; loss = −4·0.731059 = −2.924234;
    # grad = −4·σ(1)(1−σ(1))·r = −4·0.731059·0.268941·2 = −1.572895
    v, g, _ = run(SAPOLoss(), [[ln(2.0)]], [[0.0]], [[1.0]])
    assert v == pytest.approx(-2.924234, abs=1e-6) and g == pytest.approx([-1.572895], abs=1e-6)


def test_reinforce_by_hand():
    # π = [0.5, 0.25], A = 1: token mean of −A·lp = (ln 2 + ln 4)/2 = 1.039721; grad −A/N = −0.5 each
    v, g, _ = run(ReinforceLoss(), [[ln(0.5), ln(0.25)]], [[0, 0]], [[1.0]])
    assert v == pytest.approx(1.039721, abs=1e-6) and g == pytest.approx([-0.5, -0.5])
    # truncated IS, C = 1.5, ρ = π_train/π_gen = [2, 1] → w = [1.5, 1] → grad = [−0.75, −0.5]
    v, g, m = run(ReinforceLoss(rollout_correction="tis", rollout_cap=1.5), [[ln(0.5), ln(0.25)]],
                  [[ln(0.25), ln(0.25)]], [[1.0]])
    assert g == pytest.approx([-0.75, -0.5]) and m["loss/correction_truncated_frac"] == 0.5


# ---------------------------------------------------------------------------------------------- edge cases
LOSSES = {
    "grpo": lambda: GRPOLoss(beta=0.0),
    "dapo": lambda: GRPOLoss(beta=0.0, clip_high=0.28, loss_agg="token_mean"),
    "dr_grpo": lambda: GRPOLoss(beta=0.0, loss_agg="fixed_horizon", horizon=8),
    "gspo": lambda: GSPOLoss(),
    "gspo_token": lambda: GSPOLoss(token_level=True),
    "cispo": lambda: CISPOLoss(),
    "sapo": lambda: SAPOLoss(),
    "reinforce": lambda: ReinforceLoss(rollout_correction="tis", rollout_cap=2.0),
}


def batch(B=4, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    blp = -torch.rand(B, T, generator=g) * 2 - 0.1
    lp = (blp + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    return lp, blp, torch.randn(B, 1, generator=g), mask


@pytest.mark.parametrize("name", LOSSES)
def test_fully_masked_row_contributes_nothing(name):
    lp, blp, adv, mask = batch()
    mask[2] = False
    lp_garbage = lp.detach().clone()
    lp_garbage[2] = float("nan")  # whatever sits under a masked row must not leak
    x = lp_garbage.requires_grad_(True)
    adv_garbage = adv.clone()
    adv_garbage[2] = float("nan")
    v, m = call_loss(LOSSES[name](), logprobs=x, behavior_logprobs=blp.masked_fill(~mask, float("inf")),
                     advantages=adv_garbage, padding_mask=mask)
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(x.grad).all() and (x.grad[2] == 0).all()
    keep = torch.tensor([0, 1, 3])
    v_without, _ = call_loss(LOSSES[name](), logprobs=lp.detach()[keep], behavior_logprobs=blp[keep],
                             advantages=adv[keep], padding_mask=mask[keep])
    if name == "dr_grpo":  # the constant denominator B·L counts the masked row
        v_without = v_without * 3 / 4
    torch.testing.assert_close(v, v_without)


@pytest.mark.parametrize("name", LOSSES)
def test_everything_masked_gives_zero_not_nan(name):
    lp, blp, adv, mask = batch()
    v, m = call_loss(LOSSES[name](), logprobs=lp, behavior_logprobs=blp, advantages=adv,
                     padding_mask=torch.zeros_like(mask))
    v.backward()
    assert float(v.detach()) == 0.0 and (lp.grad == 0).all()
    assert all(math.isfinite(float(t)) for t in m.values())


@pytest.mark.parametrize("name", LOSSES)
def test_zero_variance_group_gives_zero_gradient(name):
    lp, blp, _, mask = batch()
    adv = compute_advantages(torch.ones(4), "group_norm")[:, None]  # every completion scored the same
    assert (adv == 0).all()
    v, m = call_loss(LOSSES[name](), logprobs=lp, behavior_logprobs=blp, advantages=adv, padding_mask=mask)
    v.backward()
    assert torch.isfinite(v) and (lp.grad == 0).all() and float(m["loss/token_frac"]) == 0.0


@pytest.mark.parametrize("name", LOSSES)
def test_batch_of_one_token(name):
    lp = torch.tensor([[-0.7]], requires_grad=True)
    v, m = call_loss(LOSSES[name](), logprobs=lp, behavior_logprobs=torch.tensor([[-0.7]]),
                     advantages=torch.tensor([1.0]), padding_mask=torch.tensor([[1.0]]))  # [B] advantages, float mask
    v.backward()
    assert v.dim() == 0 and torch.isfinite(v) and lp.grad.abs().item() > 0
    assert float(m["loss/ratio_mean"]) == pytest.approx(1.0) and float(m["loss/token_frac"]) == 1.0


def test_far_outside_clip_range_zeroes_exactly_the_clipped_gradients():
    # row 0: A > 0, r = [5, 1, 0.1]; row 1: A < 0, r = [0.1, 1, 5]; ε = 0.2, dual c = 3
    # clipped: (0,0) high, (1,0) low, (1,2) dual → 1/6 each; (0,2) is A > 0 with r < 1 − ε: not clipped
    r = torch.tensor([[5.0, 1.0, 0.1], [0.1, 1.0, 5.0]], dtype=F64)
    lp = r.log().requires_grad_(True)
    v, m = call_loss(GRPOLoss(beta=0.0, dual_clip=3.0), logprobs=lp, behavior_logprobs=torch.zeros_like(r),
                     advantages=torch.tensor([[1.0], [-1.0]], dtype=F64),
                     padding_mask=torch.ones_like(r, dtype=torch.bool))
    v.backward()
    clipped = torch.tensor([[True, False, False], [True, False, True]])
    assert (lp.grad[clipped] == 0).all() and (lp.grad[~clipped] != 0).all()
    for key in ("loss/clip_frac_high", "loss/clip_frac_low", "loss/clip_frac_dual"):
        assert float(m[key]) == pytest.approx(1 / 6), key
    assert float(m["loss/token_frac"]) == pytest.approx(0.5)
    assert float(m["loss/ratio_max"]) == pytest.approx(5.0)


def test_huge_log_ratios_stay_finite():
    lp = torch.tensor([[0.0, -200.0]], requires_grad=True)  # log-ratios +200 / −200: exp would overflow float32
    v, m = call_loss(GRPOLoss(beta=0.0), logprobs=lp, behavior_logprobs=torch.tensor([[-200.0, 0.0]]),
                     advantages=torch.tensor([[0.0]]), padding_mask=torch.ones(1, 2, dtype=torch.bool))
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(lp.grad).all() and math.isfinite(float(m["loss/ratio_max"]))


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["logprobs", "behavior_logprobs", "advantages", "entropy"])
def test_non_finite_inputs_are_rejected(name, bad, where):
    lp, blp, adv, mask = batch()
    inputs = dict(logprobs=lp.detach().clone(), behavior_logprobs=blp.clone(), advantages=adv.clone(),
                  padding_mask=mask, entropy=torch.rand_like(blp))
    inputs[where][0, 0] = bad
    loss = LOSSES[name]()
    if where == "entropy":  # built-ins read entropy only with an entropy bonus (or for the metric)
        loss = type(loss)(**{**_ctor(name), "entropy_coef": 0.01})
    with pytest.raises(ValueError, match=f"{where} has 1 NaN/inf"):
        call_loss(loss, **inputs)


def test_non_finite_ref_logprobs_are_rejected():
    lp, blp, adv, mask = batch()
    ref = blp.clone()
    ref[0, 0] = float("nan")
    with pytest.raises(ValueError, match="ref_logprobs has 1 NaN/inf"):
        call_loss(GRPOLoss(beta=0.04), logprobs=lp, behavior_logprobs=blp, ref_logprobs=ref, advantages=adv,
                  padding_mask=mask)


def _ctor(name):
    return {"grpo": dict(beta=0.0), "dapo": dict(beta=0.0, loss_agg="token_mean"),
            "dr_grpo": dict(beta=0.0, loss_agg="fixed_horizon", horizon=8), "gspo_token": dict(token_level=True),
            "reinforce": dict(rollout_correction="tis", rollout_cap=2.0)}.get(name, {})


def test_bad_shapes_and_settings_are_rejected():
    lp, blp, adv, mask = batch()
    with pytest.raises(ValueError, match="behavior_logprobs has shape"):
        call_loss(GRPOLoss(beta=0.0), logprobs=lp, behavior_logprobs=blp[:, :2], advantages=adv, padding_mask=mask)
    with pytest.raises(ValueError, match="advantages must be"):
        call_loss(GRPOLoss(beta=0.0), logprobs=lp, behavior_logprobs=blp, advantages=adv[:2], padding_mask=mask)
    with pytest.raises(ValueError, match="horizon is 3"):
        call_loss(GRPOLoss(beta=0.0, loss_agg="fixed_horizon", horizon=3), logprobs=lp, behavior_logprobs=blp,
                  advantages=adv, padding_mask=mask)
    # (out-of-range knobs are the schema's to refuse: tests/config/test_errors.py); what cannot be dispatched:
    for bad in (dict(loss_agg="mean"), dict(loss_agg="fixed_horizon")):
        with pytest.raises(ValueError, match="loss_agg"):
            GRPOLoss(**bad)
    with pytest.raises(ValueError, match="kl_estimator must be one of"):
        call_loss(GRPOLoss(beta=0.1, kl_estimator="k4"), logprobs=lp, behavior_logprobs=blp, advantages=adv,
                  padding_mask=mask, ref_logprobs=blp)
