"""The TorchTitan trainer sharded over real processes (gloo, CPU, float32) against one process on the same batches:
FSDP over 2 procs and TP over 2 procs give the same loss, gradients and updated weights over 3 AdamW steps
(<= 1e-5 relative), for a tiny Qwen3 (tied embeddings) and a tiny Llama 3 (untied head, RoPE scaling); and the
one-process TorchTitan step equals today's transformers step (trainers/update.py policy_update) on the same weights."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan", reason="trainer=titan needs the titan extra")

from forge_exp.trainers.update import Policy, policy_update  # noqa: E402
from tests.trainers.titan_cases import (  # noqa: E402
    LR, TEMPERATURE, assert_same_steps, loss_fn, rel, run_world, saved_case, tiny_model, transformers_scores,
)

TOL = 1e-5  # relative, float32
FAMILIES = ["qwen3", "llama3"]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """Per family: a saved HF checkpoint, its batches, and the one-process TorchTitan reference (grad_accum=2)."""
    cache = {}

    def get(family: str) -> dict:
        if family not in cache:
            c = saved_case(tmp_path_factory.mktemp(family), family)
            c["single"] = run_world(1, c["tmp"] / "runs", "parity_job", checkpoint=c["checkpoint"], batches=c["batches"],
                                    parallelism="single", grad_accum=2)
            cache[family] = c
        return cache[family]

    return get


def moved(steps: list[dict], model: torch.nn.Module) -> float:
    """Smallest relative change of any weight over the run: the comparison is far above rounding."""
    start = dict(model.named_parameters())
    return min(rel(w, start[n].detach()) for n, w in steps[-1]["weights"].items())


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp_over_two_processes_matches_one_process(case, family):
    c = case(family)
    # 2 data-parallel ranks x grad_accum 1 run the same two micro-batches as 1 rank x grad_accum 2
    fsdp = run_world(2, c["tmp"] / "runs", "parity_job", checkpoint=c["checkpoint"], batches=c["batches"],
                     parallelism="fsdp", grad_accum=1)
    assert moved(c["single"], c["model"]) > 1e-4  # 10x the tolerance for the slowest weight (norms)
    assert_same_steps(fsdp, c["single"], f"{family} fsdp=2")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_tp_over_two_processes_matches_one_process(case, family):
    c = case(family)
    tp = run_world(2, c["tmp"] / "runs", "parity_job", checkpoint=c["checkpoint"], batches=c["batches"],
                   parallelism="tp", grad_accum=2)
    assert_same_steps(tp, c["single"], f"{family} tp=2")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_one_process_titan_step_matches_the_transformers_step(case, family):
    c = case(family)
    model = tiny_model(family, seed=3)  # the same weights as the checkpoint
    model.config._attn_implementation = "sdpa"
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    policy = Policy(torch.device("cpu"), model, None, opt, loss_fn())
    for step, (batch, ref) in enumerate(zip(torch.load(c["batches"], weights_only=False), c["single"]), 1):
        metrics = policy_update(policy, batch, grad_accum=2, max_grad_norm=1.0, temperature=TEMPERATURE,
                                mask_truncated=True)
        assert abs(metrics["loss/total"] - ref["metrics"]["loss/total"]) <= TOL * abs(ref["metrics"]["loss/total"])
        params = dict(model.named_parameters())
        for name, w in ref["weights"].items():
            assert rel(params[name].grad, ref["grads"][name]) <= TOL, f"{family} step {step} grad {name}"
            assert rel(params[name].detach(), w) <= TOL, f"{family} step {step} weight {name}"


@pytest.mark.slow
@pytest.mark.parametrize("parallelism,procs", [("single", 1), ("fsdp", 2), ("tp", 2)])
def test_a_frozen_engine_scores_like_the_transformers_model(case, parallelism, procs):
    """trainer.hosts_reference's reference model: a frozen engine's logprobs of each batch are the transformers
    model's of its initial weights (float32) on every rank, sharded or not, while a policy on the same weights
    trains beside it; it has no gradients and no optimizer."""
    c = case("qwen3")
    got = run_world(procs, c["tmp"] / "runs", "reference_job", checkpoint=c["checkpoint"], batches=c["batches"],
                    parallelism=parallelism)
    for scores, want in zip(got["scores"], transformers_scores(c["batches"])):
        assert scores.shape == want.shape and rel(scores, want) <= TOL
    assert all(torch.equal(a, b) for rank in got["every_rank"] for a, b in zip(rank, got["scores"]))
    assert got["optimizer"] is None and got["trainable"] == []


@pytest.mark.slow
@pytest.mark.parametrize("parallelism,procs", [("single", 1), ("fsdp", 2)])
def test_a_frozen_engine_stores_its_weights_in_the_compute_dtype(case, parallelism, procs):
    """The hosted reference keeps bf16 weights (2 bytes a parameter, not a float32 master copy) and scores exactly as
    an engine that keeps float32 weights and computes in bf16: FSDP2 casts those to bf16 for every forward."""
    c = case("qwen3")
    got = run_world(procs, c["tmp"] / "runs", "reference_dtype_job", checkpoint=c["checkpoint"], batches=c["batches"],
                    parallelism=parallelism)
    assert got["stored"] == {"frozen": ["torch.bfloat16"], "policy": ["torch.float32"]}
    for frozen, policy in got["scores"]:
        assert frozen.dtype == torch.float32 and torch.count_nonzero(frozen) > 0
        assert torch.equal(frozen, policy)

