"""What a process imports is what it uses: the controller and the light services (dataset, reward, replay buffer, env)
never load transformers' modeling code, nor do the tiny model's trainer and generator (models/qwen3.py), and MLflow
is imported by the tracker's thread, not by importing the modules (benchmarks/lean.md: each heavy import costs
seconds of start-up and ~150 MiB per process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("transformers.modeling_utils", "mlflow", "torch._dynamo", "sympy")


def loaded_after(code: str, modules: tuple[str, ...] = HEAVY) -> dict[str, bool]:
    probe = f"{code}\nimport json, sys; print(json.dumps({{m: m in sys.modules for m in {modules!r}}}))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_light_services_load_no_modeling_code():
    loaded = loaded_after(
        "import forge_exp.actors.dataset, forge_exp.actors.reward, forge_exp.actors.replay_buffer, forge_exp.actors.env\n"
        "from forge_exp.models.tiny import TinyQwen3\n"
        "assert TinyQwen3().tokenizer().encode('1+2=')  # what the dataset service builds"
    )
    assert loaded == {"transformers.modeling_utils": False, "mlflow": False, "torch._dynamo": False, "sympy": False}


def test_the_controller_imports_its_loop_without_modeling_code_or_mlflow():
    loaded = loaded_after("import forge_exp.cli, forge_exp.apps.grpo, forge_exp.apps.preflight, forge_exp.tracking.mlflow")
    assert loaded == {"transformers.modeling_utils": False, "mlflow": False, "torch._dynamo": False, "sympy": False}


def test_the_default_engines_modules_load_no_modeling_code():
    """The preflight imports the trainer's and the generator's modules to ask whether their extras are installed, and
    the trainer's process runs them: transformers' optimization module (the SFT schedule) loads peft where it is
    installed, and peft the modeling code and dynamo (~2 s at start-up, benchmarks/lean.md)."""
    loaded = loaded_after("import forge_exp.trainers.hf, forge_exp.generators.native", (*HEAVY, "peft"))
    assert loaded == {"transformers.modeling_utils": False, "mlflow": False, "torch._dynamo": False, "sympy": False,
                      "peft": False}


def test_the_tiny_model_is_built_saved_and_loaded_without_modeling_code_or_dynamo(tmp_path):
    """models/qwen3.py: what the default's trainer and generator run, fresh or from its warm start."""
    loaded = loaded_after(
        "from forge_exp.models.tiny import TinyQwen3\n"
        f"TinyQwen3().build().save_pretrained({str(tmp_path)!r})\n"
        f"TinyQwen3().tokenizer().save_pretrained({str(tmp_path)!r})\n"
        f"spec = TinyQwen3(path={str(tmp_path)!r}); spec.build(); spec.tokenizer()"
    )
    assert loaded == {"transformers.modeling_utils": False, "mlflow": False, "torch._dynamo": False, "sympy": False}


@pytest.mark.slow
def test_a_released_model_still_loads_transformers_modeling_code(tmp_path):
    from forge_exp.models.tiny import TinyQwen3

    TinyQwen3().build().save_pretrained(tmp_path)
    TinyQwen3().tokenizer().save_pretrained(tmp_path)
    loaded = loaded_after(f"from forge_exp.models.hf import ModelSpec\nModelSpec(path={str(tmp_path)!r}).build()")
    assert loaded["transformers.modeling_utils"]


def test_the_loggers_beside_mlflow_import_their_library_only_when_a_run_opens_them():
    loaded = loaded_after(
        "import forge_exp.cli, forge_exp.tracking.mlflow\n"
        "from forge_exp.tracking.loggers import TensorBoard, Wandb\n"
        "TensorBoard.check_installed(), Wandb.check_installed(), TensorBoard('/tmp'), Wandb('/tmp')",
        ("tensorboard", "torch.utils.tensorboard", "wandb"),
    )
    assert loaded == {"tensorboard": False, "torch.utils.tensorboard": False, "wandb": False}
