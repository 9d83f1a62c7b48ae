"""trainer=titan through the real `forge-exp`: the trainer's processes form one torch.distributed world inside their
Monarch proc mesh (gloo on CPU); GRPO with FSDP over 2 processes learns like the one-process transformers trainer;
a sharded checkpoint saved with 2 processes resumes with 1, into the same MLflow run, every step logged once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT

pytest.importorskip("torchtitan", reason="trainer=titan needs the titan extra (bash launchers/setup.sh --test)")
pytestmark = pytest.mark.slow
SHORT = ["steps=30", "dataset.eval_size=100", "progress=false"]
FSDP2 = ["trainer=titan", "parallelism=fsdp", "services.trainer.procs=2"]


def forge_exp(tmp_path, name: str, *args: str, cache, env: dict | None = None) -> MlflowClient:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "forge_exp.cli", *args, f"tracking.run_name={name}", f"hydra.run.dir={tmp_path}/{name}",
           f"tracking.uri={uri}", f"model.warmstart.cache_dir={cache}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-4000:]
    return MlflowClient(uri)


def run_named(client: MlflowClient, name: str):
    (run,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
              if r.info.run_name == name]
    return run


def gain(client: MlflowClient, run) -> float:
    acc = sorted(client.get_metric_history(run.info.run_id, "eval/accuracy"), key=lambda m: m.step)
    return acc[-1].value - acc[0].value


def test_fsdp_over_two_processes_learns_like_one_process(tmp_path, warmstart_cache):
    client = forge_exp(tmp_path, "hf", *SHORT, cache=warmstart_cache)
    forge_exp(tmp_path, "fsdp2", *SHORT, *FSDP2, cache=warmstart_cache)
    hf, fsdp = run_named(client, "hf"), run_named(client, "fsdp2")
    assert fsdp.data.params["trainer.name"] == "titan" and fsdp.data.metrics["trainer/world_size"] == 2
    assert {"trainer/rss_gib/rank0", "trainer/rss_gib/rank1"} <= set(fsdp.data.metrics)
    g_hf, g_fsdp = gain(client, hf), gain(client, fsdp)
    assert g_hf > 0.05 and g_fsdp > 0.05, (g_hf, g_fsdp)
    assert abs(g_fsdp - g_hf) < 0.2, (g_hf, g_fsdp)  # within the spread of seeds (+0.31 ... +0.44 at 250 steps)


def test_a_sharded_checkpoint_resumes_on_another_number_of_processes(tmp_path):
    """Warm start by the titan engine itself (a fresh cache), 4 steps on FSDP-2 with a checkpoint every 2, then
    resume=true on one process to step 6: one MLflow run, each step once, the optimizer's step count continued. The
    directories the engine writes the random initial weights and the warm start to for its ranks to read are gone
    after each run."""
    run = ["model.warmstart.steps=20", "checkpoint.every=2", "dataset.eval_size=16", "progress=false",
           "algorithm.lr=1e-3"]
    scratch = Path(tempfile.mkdtemp(prefix="fx-", dir="/tmp"))  # short: Monarch's sockets live in TMPDIR too
    try:
        forge_exp(tmp_path, "r", *run, *FSDP2, "steps=4", cache=tmp_path / "cache", env={"TMPDIR": str(scratch)})
        left = [p.name for p in scratch.iterdir() if p.name.startswith(("forge-exp-titan-", "forge-exp-warm-"))]
        assert not left, left
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    client = forge_exp(tmp_path, "r", *run, "trainer=titan", "steps=6", "resume=true", cache=tmp_path / "cache")
    (only,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert only.info.status == "FINISHED"
    versions = sorted((m.step, m.value) for m in client.get_metric_history(only.info.run_id, "train/version"))
    assert versions == [(s, float(s)) for s in range(1, 7)]
    world = sorted((m.step, m.value) for m in client.get_metric_history(only.info.run_id, "trainer/world_size"))
    assert [w for _, w in world] == [2.0] * 4 + [1.0] * 2
    # each push logs the trainer's snapshot: gathered over 2 processes, then copied from the parameters on one
    capture = {key: sorted((m.step, m.value) for m in client.get_metric_history(only.info.run_id, key))
               for key in ("sync/capture_seconds", "sync/snapshot_bytes", "sync/bytes")}
    assert [s for s, _ in capture["sync/capture_seconds"]] == list(range(1, 7))
    assert all(0 < v for _, v in capture["sync/capture_seconds"])
    assert capture["sync/snapshot_bytes"] == capture["sync/bytes"]


def test_the_reference_model_in_the_trainers_engine(tmp_path, warmstart_cache):
    """trainer.hosts_reference: the KL term's reference model is a frozen copy in the titan trainer's processes
    (FSDP over 2: each scores its share of the rows; the trainer answers the reference calls, no ref_model service
    starts), as the knob left null has it for a trainer of two processes whose mesh the reference would share.
    On-policy steps give the KL of the same run with the reference service on a mesh of its own; with rollouts
    overlapping training (the default max_policy_age=1) the reference calls interleave with the train steps. With
    trainer.share_prompts a group's rows run their prompt once, in the policy and the reference: the same KL."""
    common = ["steps=3", "algorithm.beta=0.04", "dataset.eval_size=16", "progress=false", *FSDP2]
    separate = "trainer.share_prompts=false"  # (the default task turns it on)
    client = forge_exp(tmp_path, "service", *common, separate, "algorithm.max_policy_age=0",
                       "services.ref_model.mesh=''", cache=warmstart_cache)  # a mesh of its own: one process
    forge_exp(tmp_path, "hosted", *common, separate, "algorithm.max_policy_age=0", cache=warmstart_cache)  # null
    forge_exp(tmp_path, "shared", *common, "algorithm.max_policy_age=0", "trainer.share_prompts=true",
              cache=warmstart_cache)
    forge_exp(tmp_path, "overlap", *common, separate, "steps=6", "trainer.hosts_reference=true",
              cache=warmstart_cache)
    kl, callers = {}, {}
    for name in ("service", "hosted", "shared", "overlap"):
        run = run_named(client, name)
        assert run.info.status == "FINISHED"
        kl[name] = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss/kl"), key=lambda m: m.step)]
        trace = json.loads(Path(client.download_artifacts(run.info.run_id, "timeline.json", str(tmp_path / name)))
                           .read_text())
        callers[name] = {e["tid"] for e in trace["traceEvents"] if e["cat"] == "reference"}
    assert callers == {"service": {"ref_model"}, "hosted": {"trainer"}, "shared": {"trainer"},
                       "overlap": {"trainer"}}
    assert len(kl["hosted"]) == 3 and kl["hosted"][-1] > 0, kl
    assert kl["hosted"] == pytest.approx(kl["service"], rel=1e-3, abs=1e-7), kl
    assert kl["shared"] == pytest.approx(kl["hosted"], rel=1e-3, abs=1e-7), kl
    assert len(kl["overlap"]) == 6 and kl["overlap"][-1] > 0, kl
