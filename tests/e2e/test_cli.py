"""The real `forge-exp` CLI, end to end: Monarch proc meshes, GRPO, a real MLflow store. And no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT

STEPS = 30
SHORT = [f"steps={STEPS}", "dataset.eval_size=200", "progress=false"]  # the default, shorter


@pytest.fixture
def cli(tmp_path, warmstart_cache):
    def command(*args: str) -> list[str]:
        return [
            sys.executable, "-m", "forge_exp.cli", *args,
            f"hydra.run.dir={tmp_path}/run", f"tracking.uri=sqlite:///{tmp_path}/mlruns/mlflow.db",
            f"model.warmstart.cache_dir={warmstart_cache}",
        ]
    return command


def descendants_alive(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def run_watching(cmd: list[str], timeout: float, interrupt_after: float | None = None):
    """Run cmd, remembering every descendant process it ever had; optionally Ctrl-C it after some seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # actor processes import tests.e2e.boom
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: set[int] = set()
    start = time.time()
    interrupted = False
    while proc.poll() is None:
        try:
            seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        if interrupt_after is not None and not interrupted and time.time() - start > interrupt_after and len(seen) >= 2:
            proc.send_signal(signal.SIGINT)
            interrupted = True
        if time.time() - start > timeout:
            proc.kill()
            pytest.fail(f"{cmd} did not finish in {timeout}s")
        time.sleep(0.2)
    out, err = proc.communicate()
    return proc.returncode, out, err, seen


def test_default_experiment_learns_and_lands_in_mlflow(tmp_path, cli):
    code, out, err, seen = run_watching(cli(*SHORT), timeout=400)
    assert code == 0, err[-3000:]
    assert len(seen) >= 2, "expected Monarch proc meshes for the trainer and the generator"
    time.sleep(1.0)
    assert descendants_alive(seen) == [], "processes left behind after a successful run"
    assert "mlflow ui --backend-store-uri" in out

    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (exp,) = [e for e in client.search_experiments() if e.name == "forge-exp"]
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["algorithm.name"] == "grpo" and params["model.name"] == "tiny" and params["steps"] == str(STEPS)
    for key in ("reward/mean", "reward/std", "rollout/accuracy", "loss/total", "loss/clip_frac_high",
                "policy/entropy", "generator/tokens_per_s", "time/step_seconds", "sync/seconds",
                "train/policy_age", "eval/accuracy", "mismatch/kl_k3", "mismatch/ratio_p99", "mismatch/tokens"):
        assert key in run.data.metrics, key
    history = sorted(client.get_metric_history(run.info.run_id, "reward/mean"), key=lambda m: m.step)
    rewards = [m.value for m in history]
    assert [m.step for m in history] == list(range(1, STEPS + 1))  # one rollout batch per trained step
    evals = sorted(client.get_metric_history(run.info.run_id, "eval/accuracy"), key=lambda m: m.step)
    assert [m.step for m in evals] == [0, STEPS]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.02, f"reward did not rise: {rewards}"
    # the clipped ratio is taken against the generator's behaviour logprobs: off-policy batches move it off 1
    ratio_max = [m.value for m in client.get_metric_history(run.info.run_id, "loss/ratio_max")]
    assert max(ratio_max) > 1.0 + 1e-3, ratio_max
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "config")} | {
        a.path for a in client.list_artifacts(run.info.run_id, "samples")
    }
    assert artifacts == {"config/resolved.yaml", "samples/completions.json"}
    # where each step's time went (runtime/timeline.py), and every service call as a trace
    m = run.data.metrics
    assert 0 < m["timeline/train_seconds"] <= m["time/step_seconds"] + 1e-6
    assert 0 < m["timeline/sync_seconds"] < m["timeline/train_seconds"] + m["timeline/sync_seconds"] <= \
        m["time/step_seconds"] + 1e-6
    assert 0 <= m["timeline/idle_seconds"] <= m["time/step_seconds"]
    trace = json.loads(Path(client.download_artifacts(run.info.run_id, "timeline.json", str(tmp_path))).read_text())
    calls = [(e["tid"], e["name"]) for e in trace["traceEvents"]]
    assert calls.count(("trainer", "train_step")) == STEPS, calls
    assert ("generator", "generate") in calls and ("reward", "score") in calls


def test_a_rollout_correction_run_logs_the_mismatch(tmp_path, cli):
    """algorithm.rollout_correction=tis through the real CLI: the loss's ratio is anchored at the trainer's own
    logprobs (1 at the step), its correction metrics and the trainer's mismatch/ metrics land in MLflow each step."""
    steps = 4
    code, out, err, _ = run_watching(cli(f"steps={steps}", "dataset.eval_size=16", "progress=false",
                                         "algorithm.rollout_correction=tis"), timeout=300)
    assert code == 0, err[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "forge-exp"])
    assert run.data.params["algorithm.loss.rollout_correction"] == "tis"

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    for key in ("mismatch/logp_diff_abs_mean", "mismatch/kl_k3", "mismatch/ratio_min", "mismatch/ratio_p50",
                "mismatch/ratio_max", "loss/correction_weight_mean", "loss/correction_truncated_frac"):
        assert len(history(key)) == steps, key
    assert history("loss/ratio_max") == pytest.approx([1.0] * steps)  # the family's ratio: π_θ/π_train
    # step 1 trains on rollouts of the weights it starts from: every token is a current-version token, and on this
    # CPU both engines compute in float32, so the difference is rounding
    assert history("mismatch/current/tokens")[0] == history("mismatch/tokens")[0] > 0
    assert history("mismatch/current/logp_diff_abs_mean")[0] < 1e-4


def test_ctrl_c_stops_every_process(cli):
    code, out, err, seen = run_watching(cli("steps=500", "progress=false"), timeout=200, interrupt_after=8)
    assert code != 0
    assert len(seen) >= 2  # trainer and generator (the light services live in the controller)
    time.sleep(1.0)
    assert descendants_alive(seen) == [], f"orphans after Ctrl-C: {descendants_alive(seen)}"


def test_a_failing_service_stops_every_process(tmp_path, cli):
    """The trainer's loss raises at the first step, inside its actor: the run fails with that error and every proc
    mesh is stopped."""
    code, out, err, seen = run_watching(
        cli(*SHORT, "algorithm.loss._target_=tests.e2e.boom.BoomLoss"), timeout=300
    )
    assert code != 0
    assert "boom at step 1" in err
    assert len(seen) >= 2  # trainer and generator (the light services live in the controller)
    time.sleep(1.0)
    assert descendants_alive(seen) == [], f"orphans after a failure: {descendants_alive(seen)}"
    run = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db").search_experiments()]
    )[0]
    assert run.info.status == "FAILED"


def test_a_run_that_learns_nothing_says_so_once(cli):
    """Every group scores the same for many steps: advantages are 0, the gradient is 0; the run warns once."""
    code, out, err, _ = run_watching(
        cli("steps=12", "dataset.eval_size=16", "progress=false", "reward.functions.exact._target_=tests.e2e.boom.flat_reward"),
        timeout=300,
    )
    assert code == 0, err[-3000:]
    warnings = [line for line in (out + err).splitlines() if "zero reward variance for 10 steps" in line]
    assert len(warnings) >= 1 and all("algorithm.temperature" in w for w in warnings), out[-2000:]
    assert sum("forge-exp: warning:" in line for line in out.splitlines()) == 1
