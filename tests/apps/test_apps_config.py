"""Which loop runs (`run_app`), `+mode=eval`, `algorithm=sft`, and every experiment file: composed and validated
before any process starts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hydra.errors import ConfigCompositionException

from forge_exp.config.validate import validate
from tests.conftest import CONF
from tests.models.test_real_model_path import compose_cfg, save_tiny_family


def test_run_app_dispatches_eval_sft_and_the_grpo_family(monkeypatch):
    import forge_exp.apps as apps
    from forge_exp.apps import eval as eval_app
    from forge_exp.apps import grpo, sft

    called = []

    async def fake(name, *args):
        called.append(name)
        return {}

    monkeypatch.setattr(eval_app, "run", lambda *a: fake("eval"))
    monkeypatch.setattr(sft, "run", lambda *a: fake("sft"))
    monkeypatch.setattr(grpo, "build", lambda *a: fake("grpo.build"))
    monkeypatch.setattr(apps, "_grpo", lambda *a: fake("grpo"))
    for mode, algorithm in (("eval", "sft"), ("train", "sft"), ("train", "dapo"), ("eval", "grpo")):
        config = SimpleNamespace(mode=mode, algorithm=SimpleNamespace(name=algorithm))
        asyncio.run(apps.run_app(config, None, None))
    assert called == ["eval", "sft", "grpo", "eval"]


def test_plus_mode_eval_selects_the_eval_app_and_no_warm_start():
    config = validate(compose_cfg("+mode=eval", "eval.pass_k=4"))
    assert config.mode == "eval" and config.warmstart.steps == 0 and config.eval.pass_k == 4
    with pytest.raises(ConfigCompositionException, match=r"\+mode=eval"):  # Hydra says how to spell it
        compose_cfg("mode=eval")


def test_algorithm_sft_validates_and_its_knobs_are_typed():
    config = validate(compose_cfg("algorithm=sft"))
    a = config.algorithm
    assert a.name == "sft" and a.beta == 0 and a.packing and a.max_seq_len == 2048 and a.batch_size == 8
    assert a.loss["_target_"] == "forge_exp.rl.losses.sft.SFTLoss"
    for override, key in (("algorithm.max_seq_len=1", "algorithm.max_seq_len"),
                          ("algorithm.batch_size=0", "algorithm.batch_size"),
                          ("algorithm.warmup_steps=-1", "algorithm.warmup_steps")):
        with pytest.raises(ValueError, match=key):
            validate(compose_cfg("algorithm=sft", override))
    with pytest.raises(ConfigCompositionException, match="algorithm.max_seq_len"):  # a wrong type: at composition
        compose_cfg("algorithm=sft", "algorithm.max_seq_len=long")


def test_an_rl_loss_under_algorithm_sft_is_refused_before_training():
    from forge_exp.actors.sft import SFT_INPUTS
    from forge_exp.config.algorithm import build_loss
    from forge_exp.rl.losses import check_loss_inputs

    config = validate(compose_cfg("algorithm=sft", "algorithm.loss._target_=forge_exp.rl.losses.ReinforceLoss"))
    with pytest.raises(ValueError, match="asks for advantages"):
        check_loss_inputs(build_loss(config.algorithm.loss), SFT_INPUTS)


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_starts_with_its_command_and_validates(experiment, tmp_path):
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text().splitlines()
    assert text[0] == "# @package _global_" and text[1].startswith(f"# forge-exp experiment={experiment}")
    model = save_tiny_family("qwen3", tmp_path / "model")
    # services=cpu: this machine has no GPU; the rest of the experiment is validated as written
    config = validate(compose_cfg(f"experiment={experiment}", f"model.path={model}", "services=cpu"))
    assert config.name == experiment, "the experiment's root keys (name, steps, warmstart) must win over config.yaml"
    assert config.warmstart.steps == 0 and config.model.name == "qwen3_1_7b"
