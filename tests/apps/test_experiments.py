"""Every conf/experiment file composes, validates, and runs two steps through the real `forge-exp` on tiny stand-ins:
a tiny Qwen3 checkpoint with a chat template for the model, a local folder with the Hub dataset's own fields for
the data (datasets.load_dataset reads a folder of train/test files as it reads the Hub; a generated task such as
reasoning-gym's needs none), services=cpu. Everything else is the experiment as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from forge_exp.apps.preflight import check
from forge_exp.config.validate import validate
from tests.config.helpers import compose_cfg, options
from tests.conftest import CONF, ROOT
from tests.models.test_real_model_path import save_tiny_family

# The real-model experiments; the embedded CPU ones run as they are (tests/e2e/test_tool_arithmetic.py).
EXPERIMENTS = [e for e in options("experiment") if compose_cfg(f"experiment={e}").model.name != "tiny"]
ROWS = {  # a Hub dataset's fields, as its rows come
    "gsm8k": lambda a, b: {"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"},
    "math": lambda a, b: {"problem": f"Compute ${a}+{b}$.", "solution": f"So it is $\\boxed{{{a + b}}}$.",
                          "level": "Level 1", "type": "Prealgebra"},
}


def stand_ins(experiment: str, tmp_path) -> list[str]:
    base = validate(compose_cfg(f"experiment={experiment}", "services=cpu", "model.path=/x"))
    dataset = base.dataset.name
    files = []
    if dataset in ROWS:
        data = tmp_path / dataset
        data.mkdir()
        for split, n in (("train", 12), ("test", 4)):
            (data / f"{split}.jsonl").write_text("".join(json.dumps(ROWS[dataset](i, 2 * i)) + "\n" for i in range(n)))
        files = [f"dataset.path={data}", "dataset.subset=null"]
    model = save_tiny_family("qwen3", tmp_path / "model")
    return [f"experiment={experiment}", f"model.path={model}", "services=cpu", *files, "dataset.eval_size=4",
            "dataset.max_new_tokens=8", "steps=2",
            "dataset.max_prompt_tokens=256",  # prompt + response within the stand-in's 512 positions
            *(["algorithm.max_seq_len=256"] if hasattr(base.algorithm, "max_seq_len") else [])]  # SFT: the same


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_starts_with_its_command_and_passes_preflight(experiment, tmp_path):
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text().splitlines()
    assert text[0] == "# @package _global_" and text[1].startswith(f"# forge-exp experiment={experiment}")
    config = validate(compose_cfg(*stand_ins(experiment, tmp_path)))
    assert config.name == experiment and config.model.path.endswith("model")
    check(config)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_runs_two_steps_on_tiny_stand_ins(experiment, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    small = [] if "sft" in experiment else ["algorithm.prompts_per_step=2", "algorithm.group_size=2"]
    cmd = [sys.executable, "-m", "forge_exp.cli", *stand_ins(experiment, tmp_path), *small, "progress=false",
           f"hydra.run.dir={tmp_path}/run", f"tracking.uri={uri}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf_cache")})
    assert done.returncode == 0, done.stderr[-4000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.params["name"] == experiment
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss/total")] == [1, 2]
