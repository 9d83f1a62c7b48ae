"""generator=vllm inside the platform, on vLLM's CPU build (.venv-vllm): the generator actor receives the trainer's
weights through the same weight sync as the torch engine and then samples what the new weights say; a short GRPO
run of the tiny default learns through `forge-exp generator=vllm`; tensor parallelism 2 comes from
services.generator.procs=2."""

from __future__ import annotations

import asyncio
import os

import pytest

if os.environ.get("FORGE_EXP_REQUIRE_VLLM") == "1":  # .ci/run in .venv-vllm: a broken install fails, never skips
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here: these run in .venv-vllm (launchers/setup.sh --vllm)")

from tests.config.helpers import metric_history, run_experiment, typed  # noqa: E402

PROMPTS = ["12+34=", "7+8=", "90+9="]


async def update_then_generate(cfg) -> dict:
    from forge_exp.rl.types import Problem
    from forge_exp.runtime.layout import plan_for
    from forge_exp.runtime.services import Runtime
    from tests.generators.vllm_actors import GreedyTrainer
    from forge_exp.actors.generator import Generator

    out = {}
    problems = [Problem(prompt=p, target="") for p in PROMPTS]
    async with Runtime(plan_for(cfg)) as runtime:
        trainer = runtime.spawn("trainer", GreedyTrainer, cfg.trainer, cfg.model, cfg.algorithm, None, 0,
                                cfg.algorithm.loss_inputs).route()
        generators = runtime.spawn("generator", Generator, cfg.generator, cfg.model, None, 0,
                                   {"max_model_len": 64})
        generator = generators.route()
        await trainer.push_weights.call_one(generators.fanout())
        groups, _ = await generator.generate.call_one(problems, 1, 0.0, 1.0, 6)
        out["before"] = [g.completions[0].token_ids for g in groups]
        out["trainer_before"] = await trainer.greedy.call_one(PROMPTS, 6)
        await trainer.perturb.call_one(0.3)  # every weight moves: a new version
        await trainer.push_weights.call_one(generators.fanout())
        groups, metrics = await generator.generate.call_one(problems, 1, 0.0, 1.0, 6)
        out["after"] = [g.completions[0].token_ids for g in groups]
        out["version"] = {c.policy_version for g in groups for c in g.completions}
        out["trainer_after"] = await trainer.greedy.call_one(PROMPTS, 6)
    return out


@pytest.mark.parametrize("procs", [1, 2])
def test_a_weight_update_changes_the_generators_outputs_to_the_new_versions(procs):
    cfg = typed("generator=vllm", "algorithm.beta=0", f"services.generator.procs={procs}", "generator.kv_cache_gib=0.25")
    out = asyncio.run(update_then_generate(cfg))
    assert out["before"] == out["trainer_before"]  # version 0: what the trainer's model says greedily
    assert out["after"] == out["trainer_after"] and out["after"] != out["before"]
    assert out["version"] == {1}


@pytest.mark.slow
def test_grpo_with_the_vllm_generator_learns(tmp_path, warmstart_cache):
    _, client, run = run_experiment(tmp_path, "generator=vllm", "generator.kv_cache_gib=0.25", "steps=40",
                                    "dataset.eval_size=100", f"model.warmstart.cache_dir={warmstart_cache}")
    assert run.data.params["generator.name"] == "vllm"
    accuracy = metric_history(client, run, "eval/accuracy")
    assert accuracy[-1] > accuracy[0] + 0.05, accuracy
    ratio = metric_history(client, run, "loss/ratio_mean")
    assert abs(ratio[0] - 1) < 1e-3, ratio[0]  # step 1 is on-policy: vLLM's behaviour logprobs are the trainer's


@pytest.mark.slow
def test_multi_turn_tool_episodes_run_on_the_vllm_generator(tmp_path, warmstart_cache):
    """experiment=tool_arithmetic with generator=vllm: every turn of an episode is a vLLM request from an
    environment worker; the calculator's results are inserted between turns and kept out of the ratio."""
    _, client, run = run_experiment(tmp_path, "experiment=tool_arithmetic", "generator=vllm",
                                    "generator.kv_cache_gib=0.25", "steps=4", "eval.every=0", "dataset.eval_size=50",
                                    f"model.warmstart.cache_dir={warmstart_cache}")
    history = lambda key: metric_history(client, run, key)  # noqa: E731
    assert run.data.params["generator.name"] == "vllm" and run.data.params["env.name"] == "calculator"
    assert min(history("env/tool_calls")) > 0 and max(history("env/turns_mean")) > 1
    assert abs(history("loss/ratio_mean")[0] - 1) < 1e-3  # on-policy step 1, inserted tokens masked out
