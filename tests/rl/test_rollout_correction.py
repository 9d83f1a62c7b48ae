"""algorithm.loss.rollout_correction (rl/losses/correction.py) through every loss family it applies to: against the
independent float64 reference (tests/rl/loss_reference.py: ref.correction, from the formulas), value and gradient;
hand-worked GRPO cases for each mode; and what is refused."""

from __future__ import annotations

import math

import pytest
import torch

from forge_exp.rl.losses import CISPOLoss, GRPOLoss, GSPOLoss, ReinforceLoss, SAPOLoss, call_loss
from forge_exp.rl.losses.correction import RolloutCorrection
from tests.rl import loss_reference as ref
from tests.rl.test_losses_cases import run
from tests.rl.test_losses_reference import compare

ln = math.log
CAPS = {"tis": 1.5, "mis": 1.5, "seq_mask": 1.2}  # seq_mask's geometric means sit closer to 1 than token ratios

# family → (loss built with the correction's two knobs, its reference given the correction's anchor/weight/mask)
FAMILIES = {
    "grpo": (lambda **c: GRPOLoss(beta=0.04, entropy_coef=0.01, **c), lambda lp, a, adv, m, w, r, e: ref.grpo(
        lp, a, adv, m, beta=0.04, ref=r, ent=e, ent_coef=0.01, weight=w)),
    "dapo": (lambda **c: GRPOLoss(beta=0.0, clip_high=0.28, loss_agg="token_mean", dual_clip=3.0, **c),
             lambda lp, a, adv, m, w, r, e: ref.grpo(lp, a, adv, m, clip_high=0.28, dual_clip=3.0, agg="token_mean",
                                                     weight=w)),
    "cispo": (lambda **c: CISPOLoss(**c), lambda lp, a, adv, m, w, r, e: ref.cispo(lp, a, adv, m, weight=w)),
    "sapo": (lambda **c: SAPOLoss(**c), lambda lp, a, adv, m, w, r, e: ref.sapo(lp, a, adv, m, weight=w)),
    "reinforce": (lambda **c: ReinforceLoss(loss_agg="seq_mean", **c),
                  lambda lp, a, adv, m, w, r, e: ref.reinforce(lp, a, adv, m, agg="seq_mean", weight=w)),
    "gspo": (lambda **c: GSPOLoss(clip_low=0.1, clip_high=0.15, **c),
             lambda lp, a, adv, m, w, r, e: ref.gspo(lp, a, adv, m, clip_low=0.1, clip_high=0.15)),
}
CASES = [(f, m) for f in FAMILIES for m in CAPS if not (f == "gspo" and m != "seq_mask")]


@pytest.mark.parametrize("family,mode", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_every_mode_matches_the_reference_in_every_family(family, mode):
    build, reference = FAMILIES[family]

    def corrected(lp, blp, adv, mask, ref_lp, ent):
        anchor, weight, keep = ref.correction(lp, blp, mask, mode, CAPS[mode])
        return reference(lp, anchor, adv, keep, weight, ref_lp, ent)

    metrics = compare(build(rollout_correction=mode, rollout_cap=CAPS[mode]), corrected, seed=4, spread=0.5)
    # the batch exercises the mode: some tokens truncated (tis), dropped below and above the band (mis), some
    # sequences dropped and some kept (seq_mask)
    if mode == "tis":
        assert 0 < float(metrics["loss/correction_truncated_frac"]) < 1
    else:
        assert 0 < float(metrics["loss/correction_dropped_frac"]) < 1
    if mode == "seq_mask":
        assert 0 < float(metrics["loss/correction_dropped_seq_frac"]) < 1


def test_tis_by_hand():
    # π_train = [0.6, 0.3, 0.05], π_gen = [0.2, 0.3, 0.2] → ρ = [3, 1, 0.25]; A = +1, C = 2 → w = [2, 1, 0.25].
    # The ratio is taken to π_train: r = 1, inside the clip → per token −w·r·A = −w; seq_mean = −3.25/3 = −1.083333.
    # d/dlp_t = −w_t·r·A/3 = [−2/3, −1/3, −1/12]: the truncated token keeps a gradient, bounded at C.
    for cap in (2.0, None):  # None: tis's own C, 2
        v, g, m = run(GRPOLoss(beta=0.0, rollout_correction="tis", rollout_cap=cap),
                      [[ln(0.6), ln(0.3), ln(0.05)]], [[ln(0.2), ln(0.3), ln(0.2)]], [[1.0]])
        assert v == pytest.approx(-3.25 / 3) and g == pytest.approx([-2 / 3, -1 / 3, -1 / 12])
        assert m["loss/correction_truncated_frac"] == pytest.approx(1 / 3)
        assert m["loss/correction_weight_mean"] == pytest.approx(3.25 / 3) and m["loss/correction_dropped_frac"] == 0
        assert m["loss/ratio_max"] == pytest.approx(1.0) and m["loss/clip_frac_high"] == 0.0


def test_mis_by_hand():
    # the same tokens, C = 2: the band [0.5, 2] keeps the middle token only (ρ = 1, w = 1); the others are dropped,
    # out of the mean too: loss −1, gradient [0, −1, 0]
    v, g, m = run(GRPOLoss(beta=0.0, rollout_correction="mis", rollout_cap=2.0),
                  [[ln(0.6), ln(0.3), ln(0.05)]], [[ln(0.2), ln(0.3), ln(0.2)]], [[1.0]])
    assert v == pytest.approx(-1.0) and g == pytest.approx([0.0, -1.0, 0.0])
    assert m["loss/correction_dropped_frac"] == pytest.approx(2 / 3) and m["loss/correction_dropped_seq_frac"] == 0
    assert m["loss/correction_weight_mean"] == pytest.approx(1.0) and m["loss/correction_truncated_frac"] == 0


def test_seq_mask_by_hand():
    # row 0: ρ = [3, 1, 0.25], geometric mean 0.75^(1/3) = 0.9086 inside [0.5, 2]: kept, trained as without a
    #   correction (ratio to π_gen, ε = 0.2, A = +1): −[min(3, 1.2), 1, min(0.25, 0.8)]/3 = −2.45/3, gradient
    #   [0 (clipped), −1/3, −0.25/3]
    # row 1: ρ = [4, 4], geometric mean 4 > 2: dropped (without the mask it would add +4 with A = −1)
    lp = [[ln(0.6), ln(0.3), ln(0.05)], [ln(0.8), ln(0.8), 0.0]]
    blp = [[ln(0.2), ln(0.3), ln(0.2)], [ln(0.2), ln(0.2), 0.0]]
    mask = [[True, True, True], [True, True, False]]
    v, g, m = run(GRPOLoss(beta=0.0, rollout_correction="seq_mask", rollout_cap=2.0), lp, blp, [[1.0], [-1.0]], mask)
    assert v == pytest.approx(-2.45 / 3) and g == pytest.approx([0.0, -1 / 3, -0.25 / 3, 0.0, 0.0, 0.0])
    assert m["loss/correction_dropped_seq_frac"] == 0.5 and m["loss/correction_dropped_frac"] == pytest.approx(2 / 5)
    v_none, _, _ = run(GRPOLoss(beta=0.0), lp, blp, [[1.0], [-1.0]], mask)
    assert v_none == pytest.approx((-2.45 / 3 + 4.0) / 2)


def test_none_is_the_default_and_adds_no_metric():
    lp, blp, adv = [[ln(0.6), ln(0.3)]], [[ln(0.2), ln(0.3)]], [[1.0]]
    v, g, m = run(GRPOLoss(beta=0.0), lp, blp, adv)
    assert (v, g) == run(GRPOLoss(beta=0.0, rollout_correction="none", rollout_cap=3.0), lp, blp, adv)[:2]
    assert not any(k.startswith("loss/correction_") for k in m) and m["loss/ratio_max"] == pytest.approx(3.0)


def test_tis_gives_every_token_family_the_same_gradient():
    # with the ratio taken to π_train (1 at the step), the clip, CISPO's weight cap and SAPO's gate cannot act:
    # every token-ratio family's gradient is −min(ρ, C)·A·∇log π_θ, aggregated alike (token_mean here)
    g = torch.Generator().manual_seed(0)
    blp = -torch.rand(3, 4, generator=g, dtype=torch.float64) - 0.1
    lp = blp + 0.8 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.tensor([[1.0], [-0.5], [2.0]], dtype=torch.float64)
    grads = []
    for loss in (GRPOLoss(beta=0.0, loss_agg="token_mean", rollout_correction="tis"),
                 CISPOLoss(rollout_correction="tis"), SAPOLoss(loss_agg="token_mean", rollout_correction="tis"),
                 ReinforceLoss(rollout_correction="tis")):
        x = lp.clone().requires_grad_(True)
        value, _ = call_loss(loss, logprobs=x, behavior_logprobs=blp, advantages=adv,
                             padding_mask=torch.ones_like(blp, dtype=torch.bool))
        grads.append(torch.autograd.grad(value, x)[0])
    expected = -(lp - blp).exp().clamp(max=2.0) * adv / lp.numel()
    for grad in grads:
        torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


def test_what_is_refused_in_one_line():
    with pytest.raises(ValueError, match="rollout_correction must be none or seq_mask for GSPO, got tis: its ratio is "
                                         "per sequence"):
        GSPOLoss(rollout_correction="tis")
    with pytest.raises(ValueError, match="got mis"):
        GSPOLoss(token_level=True, rollout_correction="mis")
    with pytest.raises(ValueError, match=r"rollout_correction must be one of \['none', 'tis', 'mis', 'seq_mask'\]"):
        GRPOLoss(rollout_correction="is")
    with pytest.raises(ValueError, match=r"rollout_cap must be > 1 \(the band is \[1/C, C\]\), got 1.0"):
        RolloutCorrection("mis", 1.0)
    assert RolloutCorrection("seq_mask").c == 1.001 and RolloutCorrection("tis").c == 2.0
