"""What a GRPO checkpoint carries beyond the weights, piece by piece: the replay buffer (episodes and RNG) through
JSON, the prompt stream's position, the rollout seeds; and what a killed save leaves behind is cleaned up. The whole
of it, resumed bit for bit: tests/faults/test_resume_exact.py. Which checkpoint a resume takes (the newest intact
one) and which config changes it accepts."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys

import pytest

from forge_exp.driver.checkpoint import LOOP, STATE, clean_partial, latest, rollout_seed, set_aside, step_dir
from forge_exp.data import hf
from forge_exp.rl.replay import ReplayBuffer
from forge_exp.rl.types import Completion, Episode
from tests.conftest import ROOT
from tests.data.test_hf import GSM8K_TRAIN, write_jsonl


def episode(version: int, tag: float) -> Episode:
    c = Completion(prompt_ids=[1, 5], token_ids=[2, 3], logprobs=[-0.1 * tag, math.pi * tag], stop_reason="eos",
                   policy_version=version, text="23", loss_mask=[True, False])
    return Episode(completion=c, reward=tag, advantage=-tag / 3, ref_logprobs=[1 / 3, -2 / 7])


def test_the_buffer_comes_back_from_json_with_its_episodes_and_rng():
    a = ReplayBuffer(max_policy_age=1, seed=3)
    a.add([episode(v, t) for v, t in itertools.product((0, 1), (0.1, 0.7, 1.3))])
    a.sample(2, policy_version=1)  # the RNG has moved
    b = ReplayBuffer(max_policy_age=1, seed=99)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # as loop.json holds it
    assert len(b) == len(a) and b.evicted == a.evicted
    assert b.sample(4, policy_version=1) == a.sample(4, policy_version=1)  # same episodes, same shuffle, floats exact


def test_the_prompt_stream_resumes_at_its_position(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    write_jsonl(tmp_path / "train.jsonl", GSM8K_TRAIN)
    source = hf.FileProblems(train_path=str(tmp_path / "train.jsonl"), target_format="gsm8k", system_prompt="none",
                             use_chat_template=False)
    factory, _ = source.problems(None, cache_dir=str(tmp_path / "cache"))
    stream = factory()
    seen = [p.target for p in itertools.islice(stream, 13)]  # into the second epoch
    position = factory.position
    assert position == (1, 3)
    rest = [p.target for p in itertools.islice(stream, 15)]
    again, _ = source.problems(None, cache_dir=str(tmp_path / "cache"))
    assert [p.target for p in itertools.islice(again(*position), 15)] == rest
    assert len(seen) == 13


def test_rollout_seeds_are_fixed_by_seed_batch_and_call():
    seeds = {rollout_seed(s, b, c) for s, b, c in itertools.product(range(3), range(50), range(4))}
    assert len(seeds) == 600 and all(0 <= x < 2**62 for x in seeds)
    # the same in another process with another hash seed (a resumed run is another process)
    code = "from forge_exp.driver.checkpoint import rollout_seed; print(rollout_seed(0, 7, 1))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert int(other.stdout) == rollout_seed(0, 7, 1)


def test_partial_saves_are_removed_and_complete_checkpoints_kept(tmp_path):
    done = tmp_path / "step_0000004"
    done.mkdir()
    (done / STATE).write_text("{}")
    (tmp_path / ".step_0000006.k2j3h").mkdir()  # a save killed before its rename
    (tmp_path / "step_0000006").mkdir()  # a sharded save killed before its state.json
    (tmp_path / "final").mkdir()  # an SFT model: not a step checkpoint
    assert clean_partial(tmp_path) == [".step_0000006.k2j3h", "step_0000006"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "step_0000004"]
    assert clean_partial(tmp_path / "absent") == []


def saved(root, step: int, run_id: str = "r1"):
    """A checkpoint as the trainer writes one (weights, optimizer, state.json, manifest last) for a tiny model."""
    from forge_exp.models.checkpoint import save_hf_checkpoint
    from tests.models.helpers import build_tiny

    model, tok = build_tiny(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                            intermediate_size=32)
    meta = {STATE: {"step": step, "run_id": run_id, "pending_metrics": []}, LOOP: {"episodes_added": step}}
    return save_hf_checkpoint(model, tok, step_dir(root, step), meta)


def test_resume_takes_the_newest_intact_checkpoint_and_names_what_is_wrong_with_newer_ones(tmp_path):
    for step in (2, 4, 6, 8):
        saved(tmp_path, step)
    assert latest(tmp_path).step == 8
    weights = step_dir(tmp_path, 8) / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)  # a crash before the data reached the disk, a copy cut short
    (step_dir(tmp_path, 6) / STATE).write_text((step_dir(tmp_path, 6) / STATE).read_text()[:-5])  # cut short too
    damaged = []
    found = latest(tmp_path, damaged)
    assert (found.step, found.run_id, found.loop) == (4, "r1", {"episodes_added": 4})
    assert [(p.name, why) for p, why in damaged] == [
        ("step_0000008", f"model.safetensors has {weights.stat().st_size} bytes, the manifest says "
                         f"{2 * weights.stat().st_size}"),
        ("step_0000006", f"{STATE} has {len((step_dir(tmp_path, 6) / STATE).read_bytes())} bytes, the manifest says "
                         f"{len((step_dir(tmp_path, 6) / STATE).read_bytes()) + 5}"),
    ]
    lines = set_aside(damaged)
    assert lines[0].startswith(f"checkpoint {step_dir(tmp_path, 8)} is damaged (model.safetensors has ")
    assert lines[0].endswith("; moved to step_0000008.damaged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000002", "step_0000004", "step_0000006.damaged",
                                                         "step_0000008.damaged"]
    assert latest(tmp_path).step == 4 and clean_partial(tmp_path) == []  # the damaged are kept, out of the way


def test_a_checkpoint_without_a_manifest_is_read_as_before_and_bad_json_is_named(tmp_path):
    old = step_dir(tmp_path, 2)
    old.mkdir()
    (old / STATE).write_text(json.dumps({"step": 2, "run_id": "r0"}))  # written before manifests existed
    assert latest(tmp_path).step == 2
    (old / STATE).write_text('{"step": 2, "run_id"')
    damaged = []
    assert latest(tmp_path, damaged) is None
    assert damaged == [(old, f"{STATE} is not valid JSON (Expecting ':' delimiter: line 1 column 21 (char 20))")]


def test_json_keeps_floats_exactly():
    xs = [random.Random(0).random() * 10 ** e for e in range(-300, 300, 7)]
    assert json.loads(json.dumps(xs)) == xs


def test_a_resume_may_change_when_and_where_the_run_goes_on_but_not_what_it_trains():
    from forge_exp.driver.checkpoint import config_changes

    logged = {"steps": "30", "resume": "False", "eval.every": "0", "model.hidden_size": "32", "seed": "0",
              "algorithm.loss.beta": "0.0", "parallelism.name": "fsdp", "removed.by.an.upgrade": "x",
              "model.warmstart.cache_dir": "/a", "model.warmstart.steps": "20"}
    now = {"steps": 36, "resume": True, "eval": {"every": 5},
           "model": {"hidden_size": 32, "warmstart": {"cache_dir": "/b", "steps": 20}}, "seed": 0,
           "algorithm": {"loss": {"beta": 0.0}}, "parallelism": {"name": "single"},
           "dataset": {"bad_rows": "fail"}}  # (a key the run did not have)
    assert config_changes(logged, now) == {"steps": ("30", "36"), "eval.every": ("0", "5"),
                                           "parallelism.name": ("fsdp", "single"),
                                           "model.warmstart.cache_dir": ("/a", "/b")}
    now["model"]["warmstart"]["steps"] = 40  # the initial policy, which a reference model loads again
    with pytest.raises(ValueError, match=r"^resume=true: model\.warmstart\.steps=40 \(the run has 20\)"):
        config_changes(logged, now)
    now["model"]["warmstart"]["steps"] = 20
    now["model"]["hidden_size"], now["seed"] = 64, 1
    with pytest.raises(ValueError, match=r"^resume=true: model\.hidden_size=64 \(the run has 32\), seed=1 \(the run "
                                         r"has 0\): a resume continues the same training; give the run's values, or "
                                         r"start a new run in another hydra\.run\.dir \(a resume may change steps, "
                                         r"progress, eval\.\*, checkpoint\.\*"):
        config_changes(logged, now)
