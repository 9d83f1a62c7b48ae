"""`trainer=hf trainer.share_prompts=true`: the transformers trainer runs a group's prompt once (models/packing.py),
its batch ordered by prompt first. Against the same trainer without sharing on the batch in that order: the same
losses and gradient norms over 3 AdamW steps, the first step's gradients and the final weights (float32); the
forwards it ran; LoRA's reference pass (the base, adapters off) the same with and without sharing; and through
`forge-exp`, the same run either way."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from forge_exp.models.tiny import TinyQwen3
from forge_exp.rl.losses.grpo import GRPOLoss
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers.hf import HFTrainer
from forge_exp.trainers.update import available_inputs, by_prompt
from tests.conftest import ROOT
from tests.models.helpers import encode, train_batch

SIZES = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128)
PROMPTS = ["37+48=", "1+2=", "37+48=", "905*12=", "1+2=", "37+48="]  # groups: rows 0, 2, 5 and 1, 4; row 3 alone


def batch(seed: int) -> TrainBatch:
    return train_batch(PROMPTS, [[5 + (i + j + seed) % 9 for j in range(2 + i % 4)] for i in range(6)], seed)


def trainer(share: bool, lora: dict | None = None) -> HFTrainer:
    torch.manual_seed(0)
    return HFTrainer(TinyQwen3(**SIZES, lora=lora), GRPOLoss(beta=0.04, entropy_coef=0.01), device=torch.device("cpu"),
                     lr=0.01, weight_decay=0.0, loss_inputs=available_inputs(reference=True), share_prompts=share)


def record_shapes(t: HFTrainer) -> list[tuple[int, ...]]:
    shapes = []
    t.model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return shapes


def close(a: HFTrainer, b: HFTrainer, what: str, tol: float) -> None:
    """Every parameter's `what` (its gradient after a step, or its value) within `tol` of the other's, relative."""
    other = dict(b.model.named_parameters())
    for name, p in a.model.named_parameters():
        x, y = getattr(p, what), getattr(other[name], what)
        assert y.norm() > 0 and (x - y).norm() <= tol * y.norm(), (what, name)


def test_sharing_trains_as_the_separate_rows_do_in_fewer_sequences():
    shared, separate = trainer(True), trainer(False)
    shapes = record_shapes(shared)
    for step in range(3):
        b = batch(step)
        got = shared.train_step(b, grad_accum=2, max_grad_norm=1.0, temperature=0.9, mask_truncated=False)
        want = separate.train_step(by_prompt(b)[0], grad_accum=2, max_grad_norm=1.0, temperature=0.9,
                                   mask_truncated=False)
        for key in ("loss/total", "loss/kl", "loss/entropy", "policy/entropy", "train/grad_norm",
                    "mismatch/logp_diff_abs_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (step, key)
        if step == 0:  # the same weights: gradients apart by rounding
            close(shared, separate, "grad", 1e-5)
    # AdamW divides each gradient element by its own running size, so rounding in a near-zero one moves its update:
    # the weights differ by ~2e-5 after the first step, and later gradients by as much
    close(shared, separate, "data", 1e-4)
    # micro-batches of whole groups: rows 0, 2, 5 (one sequence), then 1, 4 and 3 (two)
    assert [s[0] for s in shapes] == [1, 2] * 3


def test_a_lora_reference_pass_shares_prompts_too():
    pytest.importorskip("peft")
    lora = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "layers": None}
    shared, separate = trainer(True, lora), trainer(False, lora)
    shapes = record_shapes(shared)
    b = batch(0)
    got, want = shared.ref_logprobs(b, 0.9), separate.ref_logprobs(b, 0.9)
    assert torch.allclose(got, want, atol=1e-5, rtol=0) and (want[b.response_mask] < -1e-3).all()
    assert shapes == [(3, len(encode(PROMPTS)[0]) + 2 + 4 + 3)]  # "37+48=" and its rows' responses of 2, 4, 3 tokens


def test_through_forge_exp_the_same_run_with_and_without_sharing(tmp_path, warmstart_cache):
    """The default experiment with the KL term (the reference model a service of its own, sharing as the trainer
    does), on-policy, as a two-job sweep over the knob: the same rewards and KL step by step."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "forge_exp.cli", "-m", "trainer.share_prompts=false,true", "steps=3",
           "algorithm.beta=0.04", "algorithm.max_policy_age=0", "dataset.eval_size=16", "progress=false",
           f"hydra.sweep.dir={tmp_path}/sweep", f"tracking.uri={uri}", f"model.warmstart.cache_dir={warmstart_cache}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    client = MlflowClient(uri)
    runs = {r.data.params["trainer.share_prompts"]: r for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()]) if "mlflow.parentRunId" in r.data.tags}
    history = {share: {key: [m.value for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                      key=lambda m: m.step)] for key in ("loss/kl", "reward/mean")}
               for share, run in runs.items()}
    assert sorted(runs) == ["False", "True"] and all(r.info.status == "FINISHED" for r in runs.values())
    assert len(history["True"]["loss/kl"]) == 3 and history["True"]["loss/kl"][-1] > 0, history
    assert history["True"]["reward/mean"] == history["False"]["reward/mean"], history
    assert history["True"]["loss/kl"] == pytest.approx(history["False"]["loss/kl"], rel=1e-3, abs=1e-7), history
