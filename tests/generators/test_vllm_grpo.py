"""generator=vllm inside the platform, on vLLM's CPU build (.venv-vllm): the generator actor receives the trainer's
weights through the same weight sync as the torch engine and then samples what the new weights say; a short GRPO
run of the tiny default learns through `forge-exp generator=vllm`; tensor parallelism 2 comes from
services.generator.procs=2."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

if os.environ.get("FORGE_EXP_REQUIRE_VLLM") == "1":  # .ci/run in .venv-vllm: a broken install fails, never skips
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here: these run in .venv-vllm (launchers/setup.sh --vllm)")

from mlflow.tracking import MlflowClient  # noqa: E402

from tests.config.helpers import typed  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

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
        trainer = runtime.spawn("trainer", GreedyTrainer, cfg.trainer, cfg.model, cfg.algorithm, None, 0).route()
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
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "forge_exp.cli", "generator=vllm", "generator.kv_cache_gib=0.25", "steps=40",
           "dataset.eval_size=100", "progress=false", f"model.warmstart.cache_dir={warmstart_cache}",
           f"hydra.run.dir={tmp_path}/run", f"tracking.uri={uri}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-4000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["generator.name"] == "vllm"
    accuracy = sorted(client.get_metric_history(run.info.run_id, "eval/accuracy"), key=lambda m: m.step)
    assert accuracy[-1].value > accuracy[0].value + 0.05, [(m.step, m.value) for m in accuracy]
    ratio = sorted(client.get_metric_history(run.info.run_id, "loss/ratio_mean"), key=lambda m: m.step)
    assert abs(ratio[0].value - 1) < 1e-3, ratio[0]  # step 1 is on-policy: vLLM's behaviour logprobs are the trainer's
