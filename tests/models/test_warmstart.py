"""The supervised warm start: what it trains on, that it learns, and that it stops at the target accuracy."""

import itertools

import pytest
import torch

from tests.models.helpers import build_tiny
from forge_exp.models.warmstart import collate_sft, warmstart
from forge_exp.rl.types import Problem


def small(seed=0):
    return build_tiny(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64, seed=seed)


def test_loss_mask_covers_the_answer_and_eos_only():
    _, tok = small()
    ids, mask, loss_mask = collate_sft([Problem("1+2=", "3"), Problem("37+48=", "85")], tok)
    assert tok.decode(ids[0][mask[0]]) == "<bos>1+2=3<eos>"
    assert tok.decode(ids[1][mask[1]]) == "<bos>37+48=85<eos>"
    assert tok.decode(ids[0][loss_mask[0]]) == "3<eos>"
    assert tok.decode(ids[1][loss_mask[1]]) == "85<eos>"
    assert not mask[0, -3:].any()  # right padding


def constant_task():
    """A task a 30k-parameter model learns in a few dozen steps: the answer is the first digit, repeated."""
    for i in itertools.count():
        d = str(i * 7 % 10)
        yield Problem(f"{d}+0=", d * 2)


def test_learns_and_stops_at_the_target_accuracy():
    torch.manual_seed(0)
    model, tok = small()
    metrics = warmstart(model, tok, constant_task(), steps=300, lr=3e-3, batch_size=32, target_accuracy=0.9)
    assert metrics["warmstart/reached_target"] == 1.0
    assert metrics["warmstart/accuracy"] >= 0.9
    assert metrics["warmstart/steps"] < 300
    assert metrics["warmstart/loss"] < 2.0  # from ln(vocab) ≈ 3.0 at random init
    assert not model.training
    # the accuracy it reports is greedy accuracy: check it by decoding
    from forge_exp.models.generate import generate

    problems = [Problem(f"{d}+0=", str(d) * 2) for d in range(10)]
    outs = generate(model, [tok(p.prompt)["input_ids"] for p in problems], max_new_tokens=4, temperature=0.0,
                    eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    correct = sum(tok.decode(o.token_ids, skip_special_tokens=True) == p.target for p, o in zip(problems, outs))
    assert correct >= 8


def test_runs_all_steps_without_a_target():
    model, tok = small()
    metrics = warmstart(model, tok, constant_task(), steps=5, lr=1e-3, batch_size=8)
    assert metrics["warmstart/steps"] == 5 and metrics["warmstart/reached_target"] == 0.0
    assert set(metrics) >= {"warmstart/loss", "warmstart/accuracy", "warmstart/seconds", "warmstart/tokens_per_s"}


def test_a_short_problem_list_ends_early():
    model, tok = small()
    problems = list(itertools.islice(constant_task(), 20))
    assert warmstart(model, tok, problems, steps=10, lr=1e-3, batch_size=8)["warmstart/steps"] == 3


def test_bad_target():
    model, tok = small()
    with pytest.raises(ValueError, match="target_accuracy"):
        warmstart(model, tok, constant_task(), steps=1, lr=1e-3, batch_size=8, target_accuracy=1.5)
