"""Group-relative advantages: hand values, batched groups, zero variance, bad input."""

from __future__ import annotations

import pytest
import torch

from forge_exp.rl.advantages import compute_advantages, group_norm, leave_one_out, mean_baseline


def test_hand_values():
    # rewards [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(4 · 0.25 / 3) = 0.577350
    #   group_norm = ±0.5 / 0.577350 = ±0.866025;  mean = ±0.5;  loo: 1 − 1/3 = 0.666667, 0 − 2/3 = −0.666667
    r = [1.0, 0.0, 0.0, 1.0]
    assert group_norm(r, eps=0.0).tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    assert mean_baseline(r).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert leave_one_out(r).tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_loo_is_reward_minus_mean_of_the_others():
    r = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = torch.stack([r[:, i] - (r.sum(-1) - r[:, i]) / 4 for i in range(5)], dim=-1)
    torch.testing.assert_close(leave_one_out(r), expected)


def test_batched_groups_match_one_by_one():
    r = torch.rand(4, 8, generator=torch.Generator().manual_seed(1))
    for method in ("group_norm", "mean", "loo"):
        batched = compute_advantages(r, method)
        assert batched.shape == (4, 8)
        for i in range(4):
            torch.testing.assert_close(batched[i], compute_advantages(r[i], method))


@pytest.mark.parametrize("method", ["group_norm", "mean", "loo"])
def test_zero_variance_and_singleton_groups_give_zeros(method):
    assert compute_advantages([0.7] * 8, method).tolist() == [0.0] * 8
    assert compute_advantages([1.0], method).tolist() == [0.0]


def test_bad_input():
    with pytest.raises(ValueError, match="algorithm.advantage must be one of"):
        compute_advantages([1.0, 0.0], "std")
    with pytest.raises(ValueError, match="NaN/inf"):
        compute_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="G >= 1"):
        compute_advantages([])
    assert compute_advantages(torch.tensor([1, 0])).dtype == torch.float32  # integer rewards are fine
