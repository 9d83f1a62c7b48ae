"""Every algorithm runs end to end on the default task through one `forge-exp -m 'algorithm=glob(*)'` multirun,
and each one's reward rises over a short run from the shared (cached) warm start."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import CONF, ROOT

ALGORITHMS = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))
RL = [a for a in ALGORITHMS if a != "sft"]
STEPS = 30


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, warmstart_cache):
    tmp = tmp_path_factory.mktemp("algorithms")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cmd = [
        sys.executable, "-m", "forge_exp.cli", "-m", "algorithm=glob(*)", f"steps={STEPS}", "dataset.eval_size=64",
        "progress=false", f"hydra.sweep.dir={tmp}/sweep", f"tracking.uri={uri}", f"model.warmstart.cache_dir={warmstart_cache}",
        # (SFT, in the glob too, packs problem → answer rows: model_algorithm/tiny_sft.yaml sizes them for the tiny
        # model's 64 positions)
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    children = {r.data.params.get("algorithm.name"): r for r in runs if "mlflow.parentRunId" in r.data.tags}
    return client, children, r.stdout


def test_every_algorithm_ran_as_a_child_of_one_sweep(sweep):
    client, children, stdout = sweep
    assert sorted(children) == ALGORITHMS
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert len({r.data.tags["mlflow.parentRunId"] for r in children.values()}) == 1


@pytest.mark.parametrize("algorithm", RL)
def test_reward_rises(sweep, algorithm):
    client, children, _ = sweep
    run = children[algorithm]
    rewards = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "reward/mean"), key=lambda m: m.step)]
    assert len(rewards) >= STEPS // 2
    first, last = statistics.fmean(rewards[:6]), statistics.fmean(rewards[-6:])
    assert last > first, f"{algorithm}: reward {first:.3f} → {last:.3f} over {STEPS} steps: {rewards}"
    for key in ("loss/clip_frac_low", "loss/ratio_mean", "loss/token_frac", "loss/kl", "loss/entropy",
                "mismatch/logp_diff_abs_mean", "mismatch/ratio_max"):
        assert key in run.data.metrics, (algorithm, key)
