"""LoRA end to end on the default task (`experiment=tiny_lora`), real processes: GRPO with the KL term, whose reference is
the trainer's own base with its adapters off (no reference process), learns; the weight pushes carry the adapters
alone; the checkpoint is an adapter that `model.path=` evaluates and forge-exp-merge merges to the same accuracy;
SFT trains adapters through the same keys."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import torch

from forge_exp.models.tiny import TinyQwen3
from tests.config.helpers import metric_history, run_experiment
from tests.conftest import ROOT

STEPS = 30
# rank 8 adapters on the 3 layers' 7 projections of the tiny model (hidden 128, MLP 384), float32
ADAPTER_BYTES = 4 * 3 * 8 * ((128 + 128) + 2 * (128 + 64) + (128 + 128) + 3 * (128 + 384))


def test_lora_grpo_learns_with_the_base_as_reference(tmp_path, warmstart_cache):
    ckpt = tmp_path / "ckpt"
    _, client, run = run_experiment(
        tmp_path / "grpo", "experiment=tiny_lora", "algorithm.loss.beta=0.04", f"steps={STEPS}", "dataset.eval_size=200",
        f"checkpoint.every={STEPS}", f"checkpoint.dir={ckpt}", f"model.warmstart.cache_dir={warmstart_cache}")
    assert run.info.status == "FINISHED"
    rewards = metric_history(client, run, "reward/mean")
    assert statistics.fmean(rewards[-6:]) > statistics.fmean(rewards[:6]) + 0.02, rewards
    evals = metric_history(client, run, "eval/accuracy")
    assert evals[-1] > evals[0], evals
    kl = metric_history(client, run, "loss/kl")
    assert max(kl) > 0, kl  # reference logprobs arrived (from the trainer: services has no ref_model mesh)
    assert set(metric_history(client, run, "sync/bytes")) == {float(ADAPTER_BYTES)}

    final = ckpt / f"step_{STEPS:07d}"
    names = {p.name for p in final.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt"} <= names
    assert "model.safetensors" not in names
    base = json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base and base.startswith(str(warmstart_cache))  # the cached warm start the adapters trained on

    # the adapter as a model (model.path=: its base with it merged) scores what the run's generator scored; the
    # merge command writes those weights as a plain checkpoint
    _, c, r = run_experiment(tmp_path / "eval", "+mode=eval", "model=tiny", f"model.path={final}",
                             "dataset.eval_size=200")
    assert metric_history(c, r, "eval/accuracy") == [evals[-1]]
    merged = tmp_path / "merged"
    done = subprocess.run([sys.executable, "-m", "forge_exp.models.merge", str(final), str(merged)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    want, got = TinyQwen3(path=str(final)).build().state_dict(), TinyQwen3(path=str(merged)).build().state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_lora_sft_trains_adapters(tmp_path):
    _, client, run = run_experiment(tmp_path, "algorithm=sft", "model.lora.rank=8", "steps=30", "eval.every=0")
    losses = metric_history(client, run, "eval/loss")
    assert losses[-1] < losses[0], losses
    final = tmp_path / "run" / "checkpoints" / "final"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
