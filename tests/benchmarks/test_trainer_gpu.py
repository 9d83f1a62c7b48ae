"""benchmarks/trainer_gpu.py at its --smoke shape on the CPU: the reference-pass stages (TitanTrainer.score, with and
without shared prompts) and --profile run, and a forward's rate counts 2 N FLOPs a token (a step's 6 N)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_reference_stages_and_profiles_run_at_the_smoke_shape(tmp_path):
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trainer_gpu.py"), "--smoke", "--profile",
                           "--out", str(out), "--stages", "titan_1.7b_share,ref_1.7b,ref_1.7b_share"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    tokens = result["batch"]["sequences"] * (result["batch"]["prompt_tokens"] + result["batch"]["response_tokens"])
    for name, passes in (("titan_1.7b_share", 3), ("ref_1.7b", 1), ("ref_1.7b_share", 1)):
        stage = result[name]
        assert stage["ok"], stage.get("traceback", stage)
        flops = stage["achieved_tflops"] * 1e12 * stage["step_seconds_median"]
        assert flops == pytest.approx(2 * passes * stage["params"] * tokens, rel=1e-9), name
        assert stage["profile"] and all(row["calls"] > 0 and row["self_ms"] >= 0 for row in stage["profile"])
        assert any(row["op"] == "aten::mm" for row in stage["profile"]), stage["profile"]  # the model's GEMMs
    assert result["ref_1.7b_share"]["share_prompts"] and not result["ref_1.7b"]["share_prompts"]
