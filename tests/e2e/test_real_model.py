"""A real pretrained model through the real CLI, on CPU: SmolLM2-135M-Instruct from its GGUF file (tests/models/
smollm2.py) trains a few GRPO steps on a reasoning-gym task, with per-task held-out accuracy and a checkpoint that
transformers loads; and the real model's inputs that cannot work are refused in one line before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.e2e.test_cli import descendants_alive, run_watching

SMALL = ["dataset.tasks=[chain_sum]", "dataset.task_options.chain_sum.max_terms=2", "dataset.eval_size=4",
         "dataset.fewshot=1", "dataset.max_new_tokens=12", "algorithm.prompts_per_step=2",
         "algorithm.group_size=4", "progress=false"]


def command(tmp_path, *args: str) -> list[str]:
    return [sys.executable, "-m", "forge_exp.cli", "model=smollm2_135m", *args, f"hydra.run.dir={tmp_path}/run",
            f"tracking.uri=sqlite:///{tmp_path}/mlruns/mlflow.db"]


def test_grpo_steps_on_the_real_model_end_to_end(smollm2_gguf, smollm2, tmp_path):
    from transformers import AutoModelForCausalLM

    from forge_exp.models.precision import auto_dtype

    code, out, err, seen = run_watching(command(tmp_path, f"model.path={smollm2_gguf}", *SMALL, "steps=2",
                                                "checkpoint.every=2"), timeout=900)
    assert code == 0, err[-4000:]
    dtype, why = auto_dtype(on_gpu=False)  # float32 (bf16 would be emulated) unless the CPU has native bf16
    assert f"model.dtype=auto: {dtype} ({why}" in err + out
    assert "chain_sum:" in out  # the summary's per-task line
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.dtype"] == dtype and run.data.params["dataset.name"] == "reasoning_gym"
    for key in ("eval/chain_sum/accuracy", "rollout/chain_sum/accuracy", "reward/correct", "reward/format",
                "rollout/response_length", "loss/kl"):
        assert key in run.data.metrics, key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/chain_sum/accuracy")] == [0, 2]
    checkpoint = next((tmp_path / "run" / "checkpoints").glob("step_*"))
    AutoModelForCausalLM.from_pretrained(checkpoint)  # HF safetensors of the trained model
    assert not descendants_alive(seen)


@pytest.mark.parametrize("args, message", [
    (["dataset.tasks=[chain_summ]"],
     "dataset.tasks: 'chain_summ' is not a reasoning-gym task; did you mean chain_sum, decimal_chain_sum?"),
    (["dataset.task_options.chain_sum.max_term=3"],
     "dataset.task_options.chain_sum.max_term: chain_sum takes no option 'max_term'; did you mean 'max_terms'? it "
     "takes: min_terms, max_terms, min_digits, max_digits, allow_negation"),
])
def test_bad_tasks_are_one_line_before_anything_starts(smollm2, tmp_path, args, message):
    done = subprocess.run(command(tmp_path, f"model.path={smollm2}", "dataset.tasks=[chain_sum]", *args),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == f"forge-exp: error: {message}", done.stderr
    assert not (tmp_path / "mlruns").exists()  # no run was created


def test_a_model_without_a_chat_template_is_refused_when_the_prompts_need_one(smollm2, tmp_path):
    model = tmp_path / "no_template"
    subprocess.run(["cp", "-r", smollm2, str(model)], check=True)
    (model / "chat_template.jinja").unlink()
    done = subprocess.run(command(tmp_path, f"model.path={model}", "dataset.tasks=[chain_sum]",
                                  "dataset.use_chat_template=true"), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and last.startswith("forge-exp: error: dataset.use_chat_template=true but the "
                                                    "tokenizer") and "has no chat template" in last, done.stderr
