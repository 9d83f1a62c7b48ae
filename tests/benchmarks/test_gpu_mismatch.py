"""benchmarks/gpu/run_mismatch.sh's CPU-runnable part at a tiny shape: make_model.py's Qwen3-1.7B shape shrunk to 2
layers of width 64, one generator and one mode for 2 steps on services=cpu (LAYOUT=cpu), float32 (bf16 matmuls are
slow on this CPU; the GPU run is bf16), then mismatch_table.py's JSON and table."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.benchmarks.helpers import GPU, tiny_bench


@pytest.mark.slow
def test_mismatch_benchmark_runs_at_a_tiny_shape(tmp_path):
    bench = tmp_path / "bench"
    env = tiny_bench(bench, "--layers", "2", "--hidden", "64", "--intermediate", "128")

    env.update(LAYOUT="cpu", STEPS="2", PROMPTS="1", NEW_TOKENS="6", PROMPT_TOKENS="24", GENERATORS="torch",
               MODES="seq_mask", DTYPE="float32", RUN_TIMEOUT="300")
    done = subprocess.run(["bash", str(GPU / "run_mismatch.sh")], capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = (bench / "out" / "mismatch_torch_seq_mask.config.yaml").read_text()
    assert "rollout_correction: seq_mask" in config and "name: torch" in config and "dtype: float32" in config
    (run,) = json.loads((bench / "out" / "mismatch.json").read_text())["runs"].values()
    assert (run["generator"], run["mode"], run["steps"]) == ("torch", "seq_mask", 2)
    # step 1's rollouts come from the weights step 1 starts from; both engines in float32: rounding only
    assert 0 <= run["first:mismatch/current/logp_diff_abs_mean"] < 1e-4
    assert run["first:mismatch/current/ratio_p01"] <= 1 <= run["first:mismatch/current/ratio_p99"]
    assert run["all:loss/correction_dropped_frac"] == 0.0  # C = 1.001 keeps sequences that differ by rounding
    assert "| torch | seq_mask | 2 |" in done.stdout and "| generator | mode | steps | step-1 " in done.stdout
