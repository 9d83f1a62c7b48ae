"""KL estimators (Schulman 2020): hand values, the formulas, and k1 / k3 unbiased on a categorical."""

from __future__ import annotations

import math

import pytest
import torch

from forge_exp.rl.kl import kl_estimate, kl_k1, kl_k2, kl_k3


def test_hand_values():
    # π_θ = 0.5, π_ref = 0.25: log r = log(π_ref/π_θ) = ln 0.5
    #   k1 = −log r = 0.693147;  k2 = ½ (ln 0.5)² = 0.240227;  k3 = r − 1 − log r = 0.5 − 1 + 0.693147 = 0.193147
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_k1(lp, ref).item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_k2(lp, ref).item() == pytest.approx(0.240227, abs=1e-6)
    assert kl_k3(lp, ref).item() == pytest.approx(0.193147, abs=1e-6)
    assert kl_estimate(lp, ref, "k3").item() == kl_k3(lp, ref).item()
    with pytest.raises(ValueError, match="kl_estimator must be one of"):
        kl_estimate(lp, ref, "k4")


def test_against_formulas_and_signs():
    g = torch.Generator().manual_seed(0)
    lp = -3 * torch.rand(5, 6, generator=g, dtype=torch.float64)
    ref = -3 * torch.rand(5, 6, generator=g, dtype=torch.float64)
    r = torch.exp(ref - lp)
    torch.testing.assert_close(kl_k1(lp, ref), -torch.log(r))
    torch.testing.assert_close(kl_k2(lp, ref), 0.5 * torch.log(r) ** 2)
    torch.testing.assert_close(kl_k3(lp, ref), r - 1 - torch.log(r))
    assert (kl_k2(lp, ref) >= 0).all() and (kl_k3(lp, ref) >= 0).all()
    assert (kl_k3(lp, lp) == 0).all()


def test_k1_and_k3_are_unbiased_for_kl():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    lp, ref = p.log()[samples], q.log()[samples]
    assert float(kl_k1(lp, ref).mean()) == pytest.approx(true_kl, abs=5e-3)
    assert float(kl_k3(lp, ref).mean()) == pytest.approx(true_kl, abs=5e-3)
    assert float(kl_k3(lp, ref).var()) < float(kl_k1(lp, ref).var())  # the point of k3


def test_every_configurable_choice_has_its_implementation():
    """The names a config field may take (forge_exp/choices.py) are exactly the ones the pure layers dispatch on."""
    from forge_exp import choices
    from forge_exp.models.hf import DTYPES
    from forge_exp.rl.advantages import ADVANTAGES
    from forge_exp.rl.kl import KL_ESTIMATORS
    from forge_exp.rl.losses.primitives import Aggregation

    assert set(KL_ESTIMATORS) == set(choices.KL_ESTIMATORS)
    assert set(ADVANTAGES) == set(choices.ADVANTAGES)
    assert set(DTYPES) == set(choices.DTYPES)
    for mode in choices.LOSS_AGGREGATIONS:
        Aggregation(mode, horizon=4)
