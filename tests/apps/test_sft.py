"""`forge-exp algorithm=sft` through the real CLI on a tiny Qwen3 with a chat template: chat-format rows, loss
falling, eval loss, MLflow, resumable checkpoints, resume, and a final HF checkpoint that plain transformers loads
and that GRPO (`model.path=`) and `+mode=eval` start from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import ROOT
from tests.models.test_real_model_path import save_tiny_family, write_gsm8k_jsonl

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "You add numbers."},
                  {"role": "user", "content": f"What is {a} + {b}?"},
                  {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]}
    for a, b in [(1, 2), (3, 4), (10, 5), (7, 7), (20, 22), (6, 9)]
]


def forge_exp(tmp_path, *args: str, run_dir: str = "run") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "forge_exp.cli", *args, "progress=false", f"hydra.run.dir={tmp_path}/{run_dir}",
           f"tracking.uri=sqlite:///{tmp_path}/mlruns/mlflow.db"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def runs(tmp_path) -> tuple[MlflowClient, list]:
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()], order_by=["start_time ASC"])
    return client, found


def history(client, run, key) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


@pytest.fixture
def sft_data(tmp_path):
    """Chat-format rows (prompt/completion rows go through the same loader: tests/apps/test_sft_data.py); the
    overrides that point dataset=jsonl at them."""
    data = tmp_path / "sft"
    data.mkdir()
    for split, convs in (("train", CONVERSATIONS), ("test", CONVERSATIONS[:2])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    return ["dataset=jsonl", f"dataset.train_path={data / 'train.jsonl'}", f"dataset.eval_path={data / 'test.jsonl'}"]


@pytest.mark.slow
def test_sft_trains_checkpoints_resumes_and_hands_its_model_to_grpo_and_eval(tmp_path, sft_data):
    model = save_tiny_family("qwen3", tmp_path / "base")
    sft = ["algorithm=sft", "model=qwen3_1_7b", f"model.path={model}", "services=cpu", *sft_data,
           "dataset.system_prompt=none", "algorithm.batch_size=2", "algorithm.max_seq_len=128", "algorithm.lr=3e-3",
           "algorithm.warmup_steps=1", "eval.every=3", "checkpoint.every=3"]
    first = forge_exp(tmp_path, *sft, "steps=3")
    assert "start GRPO from it: forge-exp model.path=" in first.stdout
    resumed = forge_exp(tmp_path, *sft, "steps=6", "resume=true")  # same run dir: continues after step 3

    client, (run,) = runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "sft" and run.data.params["model.name"] == "qwen3_1_7b"
    loss = history(client, run, "loss/total")
    assert [s for s, _ in loss] == [1, 2, 3, 4, 5, 6], "each step logged once across the resume"
    assert loss[-1][1] < loss[0][1], loss
    assert [s for s, _ in history(client, run, "eval/loss")] == [0, 3, 6]
    assert history(client, run, "eval/loss")[-1][1] < history(client, run, "eval/loss")[0][1]
    for key in ("train/lr", "train/grad_norm", "train/token_accuracy", "train/target_tokens", "data/examples",
                "eval/token_accuracy", "eval/perplexity"):
        assert key in run.data.metrics, key
    samples = json.loads(open(client.download_artifacts(run.info.run_id, "samples/sft_examples.json",
                                                           str(tmp_path))).read())
    assert samples["columns"] == ["text", "target"] and all(t in x for x, t in samples["data"])

    checkpoints = tmp_path / "run" / "checkpoints"
    assert {p.name for p in checkpoints.iterdir() if not p.name.startswith(".")} == {"step_0000003", "step_0000006",
                                                                                  "final"}
    assert (checkpoints / "step_0000006" / "optimizer.pt").is_file()
    final = checkpoints / "final"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in final.iterdir()}
    assert not (final / "optimizer.pt").exists()
    assert run.data.tags["forge_exp.sft.final_checkpoint"] == str(final)
    assert AutoModelForCausalLM.from_pretrained(final, local_files_only=True).config.model_type == "qwen3"
    assert AutoTokenizer.from_pretrained(final, local_files_only=True).chat_template
    assert resumed.returncode == 0

    # GRPO and a stand-alone evaluation start from the SFT model
    data = write_gsm8k_jsonl(tmp_path / "gsm8k", train=8, test=4)
    gsm8k = ["model=qwen3_1_7b", f"model.path={final}", "services=cpu", *data,
             "dataset.target_format=gsm8k", "dataset.system_prompt=none", "dataset.max_new_tokens=8",
             "dataset.eval_size=4", "reward=math", "dataset.max_prompt_tokens=256"]  # + response: the tiny's 512
    forge_exp(tmp_path, *gsm8k, "steps=1", "algorithm.beta=0", "algorithm.group_size=2",
              "algorithm.prompts_per_step=2", run_dir="grpo")
    evaluated = forge_exp(tmp_path, "+mode=eval", *gsm8k, "eval.pass_k=2", run_dir="eval")
    assert "eval/accuracy" in evaluated.stdout
    client, (_, grpo, ev) = runs(tmp_path)
    assert grpo.info.status == "FINISHED" and grpo.data.params["model.path"] == str(final)
    assert [s for s, _ in history(client, grpo, "loss/total")] == [1]
    assert ev.info.status == "FINISHED" and ev.data.params["mode"] == "eval"
    assert [s for s, _ in history(client, ev, "eval/accuracy")] == [0]
    assert "eval/pass_at_2" in ev.data.metrics and ev.data.metrics["eval/problems"] == 4
