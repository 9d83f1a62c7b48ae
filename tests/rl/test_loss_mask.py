"""Multi-turn loss masking on hand-built episodes, against an independent float64 reference.

The reference runs each episode's whole sequence [prompt | model turn | env insertion | model turn] unpadded
through a float64 copy of the model, takes the logprob of every token that follows, and sums the clipped-surrogate
and k3 terms over the model's tokens only (token_mean: divided by their count), with plain Python loops. The
platform path is collate_episodes -> policy_update with GRPOLoss; its gradient must match the reference's, and
nothing written at environment positions (behaviour or reference logprobs, even NaN) may change it.
"""

import copy
import math

import pytest
import torch

from forge_exp.data.collate import collate_episodes
from forge_exp.rl.losses import GRPOLoss
from forge_exp.rl.types import Completion, Episode
from forge_exp.trainers.update import Policy, policy_update
from tests.models.helpers import TOK, peaky_model

# Two hand-built episodes. Ids are tokens of the character vocabulary (4.. are characters).
PROMPTS = [[2, 5, 6, 7], [2, 8]]
TOKENS = [[9, 10, 1, 11, 12, 13, 14, 1], [15, 16, 17, 1]]
MASKS = [[True, True, True, False, False, False, True, True], None]  # ep 1: env inserted 3 tokens; ep 2: single turn
ADVANTAGES = [0.8, -0.6]
CLIP = 0.2


def behaviour(seed_shift: float, env_value: float) -> list[list[float]]:
    """Behaviour logprobs: plausible values on model tokens, `env_value` where the environment wrote."""
    out = []
    for toks, mask in zip(TOKENS, MASKS):
        mask = mask or [True] * len(toks)
        out.append([(-1.0 - 0.1 * t + seed_shift) if m else env_value for t, m in zip(range(len(toks)), mask)])
    return out


def episodes(blp, ref=None):
    return [
        Episode(Completion(p, t, b, "eos", 0, loss_mask=m), reward=0.0, advantage=a, ref_logprobs=r)
        for p, t, b, m, a, r in zip(PROMPTS, TOKENS, blp, MASKS, ADVANTAGES, ref or [None, None])
    ]


def platform_grad(model, eps, beta=0.0):
    model = copy.deepcopy(model)
    loss = GRPOLoss(clip_low=CLIP, clip_high=CLIP, beta=beta, loss_agg="token_mean")
    policy = Policy(torch.device("cpu"), model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), loss)
    metrics = policy_update(policy, collate_episodes(eps, pad_id=0), grad_accum=1, max_grad_norm=1e9, temperature=1.0)
    return metrics, {n: p.grad.clone() for n, p in model.named_parameters()}


def reference_grad(model, blp, beta=0.0, ref=None):
    model = copy.deepcopy(model).double()
    terms = []
    for i, (prompt, toks, mask) in enumerate(zip(PROMPTS, TOKENS, MASKS)):
        mask = mask or [True] * len(toks)
        seq = torch.tensor([prompt + toks])
        logp = torch.log_softmax(model(input_ids=seq).logits[0].double(), -1)  # [L, V]
        for t, (tok, is_model) in enumerate(zip(toks, mask)):
            if not is_model:
                continue
            lp = logp[len(prompt) + t - 1, tok]
            ratio = torch.exp(lp - blp[i][t])
            a = ADVANTAGES[i]
            clipped = min(max(ratio, torch.tensor(1 - CLIP, dtype=torch.float64)), torch.tensor(1 + CLIP, dtype=torch.float64))
            term = -min(ratio * a, clipped * a)
            if beta:
                term = term + beta * (torch.exp(ref[i][t] - lp) - (ref[i][t] - lp) - 1.0)
            terms.append(term)
    loss = sum(terms) / len(terms)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def assert_grads_close(got, want):
    """float32 platform vs float64 reference: agreement to float32 precision of the largest gradient entry."""
    for name in want:
        scale = max(1.0, float(want[name].abs().max()))
        torch.testing.assert_close(got[name].double(), want[name], rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_collate_carries_the_loss_mask():
    b = collate_episodes(episodes(behaviour(0.0, 0.0)), pad_id=0)
    assert b.loss_mask.tolist() == [MASKS[0], [True] * 4 + [False] * 4]
    assert b.response_mask.tolist() == [[True] * 8, [True] * 4 + [False] * 4]  # attention still sees env tokens


def test_gradient_matches_the_reference_and_ignores_env_positions():
    model = peaky_model(0)
    blp = behaviour(0.3, 0.0)
    metrics, grads = platform_grad(model, episodes(blp))
    ref_loss, ref_grads = reference_grad(model, blp)
    assert metrics["loss/total"] == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    assert_grads_close(grads, ref_grads)
    # garbage (even NaN) behaviour logprobs where the environment wrote change nothing
    for env_value in (123.0, float("nan")):
        _, g2 = platform_grad(model, episodes(behaviour(0.3, env_value)))
        for name in grads:
            assert torch.equal(grads[name], g2[name]), name


def test_reference_kl_uses_model_tokens_only():
    model = peaky_model(1)
    blp = behaviour(0.1, 0.0)
    ref = [[-1.5 + 0.05 * t if m else float("nan") for t, m in enumerate(MASKS[0])], [-2.0, -1.0, -1.2, -0.7]]
    metrics, grads = platform_grad(model, episodes(blp, ref), beta=0.1)
    ref_loss, ref_grads = reference_grad(model, blp, beta=0.1, ref=ref)
    assert math.isfinite(metrics["loss/total"]) and metrics["loss/total"] == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    assert_grads_close(grads, ref_grads)


def test_env_tokens_are_context_for_later_model_tokens():
    """Changing what the environment inserted changes the logprobs (and so the gradient) of the model's later turn:
    the insertion is attended to, only not trained on."""
    model = peaky_model(2)
    blp = behaviour(0.0, 0.0)
    _, grads = platform_grad(model, episodes(blp))
    saved = TOKENS[0][3]
    try:
        TOKENS[0][3] = 18
        _, other = platform_grad(model, episodes(blp))
    finally:
        TOKENS[0][3] = saved
    assert any(not torch.allclose(grads[n], other[n]) for n in grads)


def test_single_turn_is_bit_identical_to_the_response_mask_path():
    """Single-turn completions (loss_mask None): the collated loss mask is the response mask, and an optimizer step
    gives bit-identical weights to the same step with no loss mask in the batch (update's pre-multi-turn path)."""
    eps = [Episode(Completion(p, t, [-1.0 - 0.01 * j for j in range(len(t))], "eos", 0), 0.0, a)
           for p, t, a in zip(PROMPTS, TOKENS, ADVANTAGES)]
    batch = collate_episodes(eps, pad_id=0)
    assert torch.equal(batch.loss_mask, batch.response_mask)
    legacy = copy.copy(batch)
    legacy.loss_mask = None
    weights = []
    for b in (batch, legacy):
        model = peaky_model(3)
        policy = Policy(torch.device("cpu"), model, TOK, torch.optim.AdamW(model.parameters(), lr=1e-3), GRPOLoss(beta=0.0))
        policy_update(policy, b, grad_accum=2, max_grad_norm=1.0, temperature=1.0)
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))
