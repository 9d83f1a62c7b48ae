"""benchmarks/gpu/run_lora.sh's CPU-runnable part at a tiny shape: make_model.py writes the Qwen3-8B shape shrunk to
2 layers (its vocabulary, heads and untied head kept), and the script's own command runs it with LoRA on the CPU
(LAYOUT=cpu: services=cpu, no nvidia-smi or matmul peak), summarises it and prints the side-by-side table."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.benchmarks.helpers import GPU, tiny_bench

pytest.importorskip("peft")


@pytest.mark.slow
def test_lora_benchmark_runs_at_a_tiny_shape(tmp_path):
    bench = tmp_path / "bench"
    env = tiny_bench(bench, "--shape", "8b", "--layers", "2", "--hidden", "256", "--intermediate", "512")
    config = json.loads((bench / "qwen3_8b" / "config.json").read_text())
    assert (config["num_attention_heads"], config["tie_word_embeddings"], config["vocab_size"]) == (32, False, 151936)

    env.update(LAYOUT="cpu", STEPS_8B="3", PROMPTS="1", NEW_TOKENS="6", PROMPT_TOKENS="24", RUN_TIMEOUT="500")
    done = subprocess.run(["bash", str(GPU / "run_lora.sh"), "8b"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((bench / "out" / "lora_8b.json").read_text())
    # rank-32 adapters on q, k, v, o, gate, up, down of 2 layers (hidden 256, 32 x 128 query, 8 x 128 kv, MLP 512)
    dims = [(256, 4096), (256, 1024), (256, 1024), (4096, 256), (256, 512), (256, 512), (512, 256)]
    assert result["weight_push_bytes"] == 4 * 2 * sum(32 * (i + o) for i, o in dims)
    assert result["steps_logged"] == 3 and result["step_seconds"] > 0
    assert "model.lora.rank=32" in result["command"] and "services=cpu" in result["command"]
    table = json.loads((bench / "out" / "lora.json").read_text())
    assert set(table["runs"]) == {"lora_8b"}
    assert "| weight push (MiB) |" in done.stdout
