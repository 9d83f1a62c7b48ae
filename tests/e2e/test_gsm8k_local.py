"""GRPO end to end on GSM8K-format data, offline: the tiny model from a local HF checkpoint, local jsonl rows with
`question` and `answer: "... #### 42"`, MathReward, evaluation during training (greedy accuracy and pass@k), and a
user reward (`_target_`) that raises or returns NaN on some completions — through the real `forge-exp` CLI, into
MLflow."""

from __future__ import annotations

import os
import subprocess
import sys

from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.models.test_real_model_path import write_gsm8k_jsonl


class FlakyReward:
    """A torchforge-style user reward, `__call__(prompt, response, target) -> float`, that fails on some inputs:
    it raises on responses of a length divisible by 3 and returns NaN on those of length 1 mod 3."""

    def __call__(self, prompt: str, response: str, target: str) -> float:
        if len(response) % 3 == 0:
            raise RuntimeError(f"cannot score {response!r}")
        return float("nan") if len(response) % 3 == 1 else 1.0


def test_grpo_on_local_gsm8k_rows_from_a_local_checkpoint_lands_in_mlflow(tmp_path):
    from tests.models.helpers import build_tiny
    from forge_exp.models.checkpoint import save_hf_checkpoint

    checkpoint = save_hf_checkpoint(*build_tiny(), tmp_path / "tiny")
    data = write_gsm8k_jsonl(tmp_path / "gsm8k", train=32, test=8, digits=True)
    store = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    cmd = [
        sys.executable, "-m", "forge_exp.cli", f"model.path={checkpoint}", "reward=math", *data,
        "dataset.target_format=gsm8k", "dataset.max_new_tokens=8",
        "steps=4", "algorithm.prompts_per_step=4", "algorithm.group_size=4",
        "eval.every=2", "eval.pass_k=2",
        "+reward.functions.flaky={_target_: tests.e2e.test_gsm8k_local.FlakyReward, weight: 0.0}",
        "reward.max_failure_rate=1.0",  # it fails on ~2/3 of the completions by design: the run must go on
        "progress=false", f"hydra.run.dir={tmp_path}/run", f"tracking.uri={store}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # actor processes import FlakyReward
    assert done.returncode == 0, done.stderr[-4000:]

    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model.path"] == str(checkpoint) and params["model.name"] == "tiny"
    assert params["dataset.name"] == "jsonl" and params["dataset.target_format"] == "gsm8k"
    assert params["reward.name"] == "math"
    assert params["reward.functions.correct._target_"] == "forge_exp.rewards.math.MathReward"

    def steps(key: str) -> list[int]:
        return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))

    assert steps("loss/total") == steps("reward/mean") == [1, 2, 3, 4]
    assert steps("eval/accuracy") == steps("eval/pass_at_2") == [0, 2, 4]  # start, every 2 steps, end
    for key in ("reward/correct", "rollout/accuracy", "generator/tokens_per_s", "eval/reward"):
        assert key in run.data.metrics, key
    # the flaky reward failed on some completions, was counted, and the run went on
    failures = [m.value for m in client.get_metric_history(run.info.run_id, "reward/failures")]
    failed = [m.value for m in client.get_metric_history(run.info.run_id, "reward/failed/flaky")]
    assert sum(failures) > 0 and len(failed) == 4 and all(0 < f <= 1 for f in failed), (failures, failed)
    assert "reward function 'flaky' failed" in done.stderr + done.stdout
