"""The mismatch/ metrics (rl/mismatch.py): on a made-up batch against hand-worked numbers and numpy's quantiles, and
through the trainer's step (trainers/update.py) against an independent per-episode forward of the model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forge_exp.data.collate import collate_episodes
from forge_exp.rl.losses import GRPOLoss
from forge_exp.rl.mismatch import mismatch_metrics
from forge_exp.trainers.update import Policy, policy_update
from tests.models.helpers import TOK, peaky_model
from tests.rl.test_loss_mask import MASKS, PROMPTS, TOKENS, behaviour, episodes

ln = math.log


def test_metrics_of_a_made_up_batch_by_hand():
    # Δ = log π_train − log π_gen on the real tokens: row 0 [ln 2, 0, −ln 2], row 1 [ln 4] (its 2nd position is
    # padding, with garbage), row 2 [0, 0]; rows 0 and 2 were sampled at the trainer's version
    gen = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 7.0, 0.0], [-0.2, -0.1, 0.0]], dtype=torch.float64)
    delta = torch.tensor([[ln(2), 0.0, -ln(2)], [ln(4), float("nan"), 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False], [True, True, False]])
    m = mismatch_metrics(gen + delta, gen, mask, current=torch.tensor([True, False, True]))
    # ρ over the 6 real tokens: [2, 1, 0.5, 4, 1, 1]
    assert m["mismatch/tokens"] == 6 and m["mismatch/current/tokens"] == 5
    assert m["mismatch/logp_diff_abs_mean"] == pytest.approx((ln(2) * 2 + ln(4)) / 6)
    assert m["mismatch/logp_diff_mean"] == pytest.approx(ln(4) / 6)
    k3 = lambda r: r - 1 - ln(r)  # noqa: E731 — per token: (ρ − 1) − log ρ
    assert m["mismatch/kl_k3"] == pytest.approx((k3(2) + k3(0.5) + k3(4)) / 6)
    assert (m["mismatch/ratio_min"], m["mismatch/ratio_max"], m["mismatch/ratio_p50"]) == pytest.approx((0.5, 4, 1))
    rho = np.array([2, 1, 0.5, 4, 1, 1], dtype=np.float64)
    assert m["mismatch/ratio_p01"] == pytest.approx(np.quantile(rho, 0.01))  # 0.5 + 0.05·(1 − 0.5)
    assert m["mismatch/ratio_p99"] == pytest.approx(np.quantile(rho, 0.99))  # 2 + 0.95·(4 − 2)
    # the current-version tokens (rows 0 and 2): ρ = [2, 1, 0.5, 1, 1], no ln 4
    assert m["mismatch/current/logp_diff_abs_mean"] == pytest.approx(2 * ln(2) / 5)
    assert m["mismatch/current/logp_diff_mean"] == pytest.approx(0.0, abs=1e-15)
    assert m["mismatch/current/ratio_max"] == pytest.approx(2.0)
    # no episode at the current version: no current/ keys; no version given: none either
    assert not any("/current/" in k for k in mismatch_metrics(gen + delta, gen, mask, torch.zeros(3, dtype=bool)))
    assert not any("/current/" in k for k in mismatch_metrics(gen + delta, gen, mask))


@pytest.mark.parametrize("n", [7, 1000, 4097])
def test_quantiles_match_numpy(n):
    g = torch.Generator().manual_seed(n)
    train, gen = torch.randn(1, n, generator=g, dtype=torch.float64), torch.randn(1, n, generator=g, dtype=torch.float64)
    m = mismatch_metrics(train, gen, torch.ones(1, n, dtype=torch.bool))
    rho = np.exp(train.numpy() - gen.numpy()).ravel()
    for key, q in (("min", 0.0), ("p01", 0.01), ("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
        assert m[f"mismatch/ratio_{key}"] == pytest.approx(np.quantile(rho, q), rel=1e-12), key


def own_logprobs(model) -> list[list[float]]:
    """Each episode's logprobs of its tokens from one unpadded float64 forward of its whole sequence."""
    model = model.double()
    out = []
    for prompt, toks in zip(PROMPTS, TOKENS):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + toks])).logits[0], -1)  # [L, V]
        out.append([float(logp[len(prompt) + t - 1, tok]) for t, tok in enumerate(toks)])
    return out


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_step_measures_its_own_logprobs_against_the_behaviour_over_model_tokens(grad_accum):
    model = peaky_model(4)
    blp = behaviour(0.3, float("nan"))  # NaN where the environment wrote: not the model's tokens, never measured
    eps = episodes(blp)
    eps[1].completion.policy_version = 3  # the second episode is one version stale
    batch = collate_episodes(eps, pad_id=0)
    policy = Policy(torch.device("cpu"), model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), GRPOLoss(beta=0.0))
    m = policy_update(policy, batch, grad_accum=grad_accum, max_grad_norm=1.0, temperature=1.0, version=4)
    train = own_logprobs(peaky_model(4))
    deltas = [[t - b for t, b, own in zip(tr, bl, mask or [True] * len(tr)) if own]
              for tr, bl, mask in zip(train, blp, MASKS)]
    flat = [d for row in deltas for d in row]
    assert m["mismatch/tokens"] == len(flat) == 9
    assert m["mismatch/logp_diff_abs_mean"] == pytest.approx(np.mean(np.abs(flat)), rel=1e-5)
    assert m["mismatch/kl_k3"] == pytest.approx(np.mean([math.exp(d) - 1 - d for d in flat]), rel=1e-4)
    assert m["mismatch/ratio_max"] == pytest.approx(math.exp(max(flat)), rel=1e-5)
    assert m["mismatch/ratio_p50"] == pytest.approx(np.quantile(np.exp(flat), 0.5), rel=1e-5)
    assert "mismatch/current/tokens" not in m  # neither episode is at version 4
    m = policy_update(policy, batch, grad_accum=grad_accum, max_grad_norm=1.0, temperature=1.0, version=3)
    assert m["mismatch/current/tokens"] == len(deltas[1]) == 4
    assert m["mismatch/current/logp_diff_mean"] == pytest.approx(np.mean(deltas[1]), rel=1e-5)
