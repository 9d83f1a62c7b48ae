"""Which loop runs (`run_app`), `mode=eval`, `algorithm=sft`, and every experiment file: composed and validated
before any process starts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hydra.errors import ConfigCompositionException

from forge_exp.config.algorithm import RLAlgorithm, SFTAlgorithm
from forge_exp.config.validate import validate
from tests.config.helpers import compose_cfg, typed


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
    sft, dapo = typed("algorithm=sft").algorithm, typed("algorithm=dapo").algorithm
    for mode, algorithm in (("eval", sft), ("train", sft), ("train", dapo), ("eval", dapo)):
        config = SimpleNamespace(mode=mode, algorithm=algorithm)
        asyncio.run(apps.run_app(config, None, None))
    assert called == ["eval", "sft", "grpo", "eval"]


def test_mode_eval_selects_the_eval_app_with_or_without_the_plus():
    for spelling in ("mode=eval", "+mode=eval"):  # +mode=eval: the spelling from before mode had a default
        config = validate(compose_cfg(spelling, "eval.pass_k=4"))
        assert config.mode == "eval" and config.eval.pass_k == 4
    assert validate(compose_cfg()).mode == "train"


def test_algorithm_sft_validates_and_its_knobs_are_typed():
    config = validate(compose_cfg("algorithm=sft"))
    a = config.algorithm
    assert isinstance(a, SFTAlgorithm) and not isinstance(a, RLAlgorithm)
    assert a.name == "sft" and a.beta == 0 and a.packing and a.max_seq_len == 64 and a.batch_size == 64  # tiny_sft
    assert a.loss._target_ == "forge_exp.rl.losses.sft.SFTLoss"
    real = validate(compose_cfg("algorithm=sft", "model=qwen3_0_6b")).algorithm
    assert (real.max_seq_len, real.batch_size, real.lr) == (2048, 8, 1e-5)
    for override, key in (("algorithm.max_seq_len=1", "algorithm.max_seq_len"),
                          ("algorithm.batch_size=0", "algorithm.batch_size"),
                          ("algorithm.warmup_steps=-1", "algorithm.warmup_steps")):
        with pytest.raises(ValueError, match=key):
            validate(compose_cfg("algorithm=sft", override))
    with pytest.raises(ConfigCompositionException, match="algorithm.max_seq_len"):  # a wrong type: at composition
        compose_cfg("algorithm=sft", "algorithm.max_seq_len=long")


def test_an_rl_loss_under_algorithm_sft_is_refused_before_training():
    from forge_exp.apps.preflight import check

    config = validate(compose_cfg("algorithm=sft", "algorithm.loss._target_=forge_exp.rl.losses.ReinforceLoss"))
    with pytest.raises(ValueError, match="asks for advantages"):
        check(config)


def test_the_warm_start_cache_key_is_what_changes_the_weights(tmp_path):
    from forge_exp.apps.common import WarmStart

    def key(*overrides: str) -> str:
        return WarmStart.of(typed(*overrides)).dir.name

    base = key()
    # the held-out set and the cache's own place do not change the weights: the cached ones are loaded
    assert key("dataset.eval_size=8") == key(f"model.warmstart.cache_dir={tmp_path}") == base
    assert WarmStart.of(typed(f"model.warmstart.cache_dir={tmp_path}")).dir.parent == tmp_path
    for changed in ("seed=1", "model.hidden_size=64", "model.warmstart.lr=0.01", "dataset.digits=3"):
        assert key(changed) != base, changed


def test_the_trainer_is_told_what_the_loss_takes_and_the_lr_schedule():
    """The trainer actor serves what it is told (the algorithm's loss_inputs; SFT's warm-up and cosine schedule from
    apps/sft.py), without asking which algorithm runs."""
    from forge_exp.apps.common import TrainerPlan, spawn_trainer

    class Runtime:
        def spawn(self, name, actor, *args, **kwargs):
            return name, args, kwargs

    for overrides, schedule in ((("algorithm.beta=0.04",), None), (("algorithm=sft",), (0, 200))):
        config = typed(*overrides)
        name, args, kwargs = asyncio.run(spawn_trainer(Runtime(), TrainerPlan.of(config), None, 0,
                                                          lr_schedule=schedule))
        assert name == "trainer" and args[5] == config.algorithm.loss_inputs and kwargs["lr_schedule"] == schedule
    assert "ref_logprobs" in typed("algorithm.beta=0.04").algorithm.loss_inputs
    assert typed("algorithm=sft").algorithm.loss_inputs == {"logprobs", "padding_mask"}


def test_the_grpo_loop_reads_its_view_of_the_config():
    from forge_exp.apps.common import EvalPlan
    from forge_exp.apps.grpo import GRPORun

    config = typed("reward.max_failure_rate=0.5")
    run = GRPORun.of(config)
    assert run.algorithm is config.algorithm and run.eval == EvalPlan.of(config) and run.steps == config.steps
    assert run.reward_failures == (0.5, config.reward.failure_steps)


def test_the_reference_model_is_the_runs_first_policy_after_a_resume_too(tmp_path):
    """ReferencePlan gives the reference model the warm start's weights, not the checkpoint a resumed trainer
    loads (tests/faults/test_resume_exact.py runs it); a resume whose warm start cache is gone says so before
    anything starts. With LoRA the reference is the trainer's base; without the KL term there is none."""
    from forge_exp.apps.common import ReferencePlan, WarmStart

    cfg = typed("algorithm.beta=0.04", f"model.warmstart.cache_dir={tmp_path / 'cache'}")
    warm = WarmStart.of(cfg)
    plan = ReferencePlan.of(cfg, warm, resumed=False)
    assert plan.path == str(warm.dir) and plan.service and not plan.hosted
    with pytest.raises(ValueError, match=r"^resume: the reference model .* warm start cached in .*, which is gone"):
        ReferencePlan.of(cfg, warm, resumed=True)
    warm.dir.mkdir(parents=True)
    (warm.dir / "config.json").write_text("{}")
    assert ReferencePlan.of(cfg, warm, resumed=True).path == str(warm.dir)
    lora = typed("algorithm.beta=0.04", "experiment=tiny_lora")
    assert not ReferencePlan.of(lora, WarmStart.of(lora), resumed=True).service
    assert ReferencePlan.of(typed("algorithm.beta=0"), warm, resumed=True) is None


def test_the_reference_service_shares_prompts_as_the_trainer_does():
    from forge_exp.apps.common import ReferencePlan

    for share in (False, True):
        plan = ReferencePlan.of(typed("algorithm.beta=0.04", f"trainer.share_prompts={str(share).lower()}"), None, False)
        assert plan.service and plan.share_prompts is share
