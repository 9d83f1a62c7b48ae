"""vLLM (its CPU build, in .venv-vllm) serves the real pretrained model of tests/models/smollm2.py: SmolLM2-135M-Instruct
from its GGUF file, through the HF folder forge-exp converts it to, on reasoning-gym prompts in its chat template.
Each sampled token's behaviour logprob equals a float32 transformers recompute of the same tokens, and greedy
tokens are the recompute's argmax."""

from __future__ import annotations

import os

import pytest

if os.environ.get("FORGE_EXP_REQUIRE_VLLM") == "1":  # .ci/run in .venv-vllm: a broken install fails, never skips
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here: these run in .venv-vllm (launchers/setup.sh --vllm)")

from forge_exp.data.reasoning_gym import ReasoningGymProblems  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.vllm import VllmEngine  # noqa: E402
from forge_exp.models.hf import Pretrained  # noqa: E402
from tests.generators.test_vllm import check, run  # noqa: E402


def test_vllm_serves_the_real_model_with_the_recomputes_logprobs(smollm2):
    spec = Pretrained(path=smollm2, dtype="float32")
    tokenizer = spec.tokenizer()
    source = ReasoningGymProblems(tasks=["chain_sum"], eval_size=3, fewshot=1,
                                  task_options={"chain_sum": {"max_terms": 2, "max_digits": 2}})
    prompts = [tokenizer(p.prompt)["input_ids"] for p in source.eval_problems(tokenizer)]
    hf = spec.build()
    with VllmEngine(spec, "cpu", seed=0, kv_cache_gib=0.25, max_model_len=512) as engine:
        greedy = run(engine.generate(prompts, Sampling(n=1, temperature=0.0, max_new_tokens=16)))
        sampled = run(engine.generate(prompts, Sampling(n=2, temperature=1.0, max_new_tokens=16)))
    for prompt, row in zip(prompts, greedy):
        check(hf, prompt, row[0].token_ids, row[0].logprobs, 0.0, greedy=True, tol=2e-3)
    for prompt, row in zip(prompts, sampled):
        for g in row:
            check(hf, prompt, g.token_ids, g.logprobs, 1.0, tol=2e-3)
    texts = [tokenizer.decode(row[0].token_ids, skip_special_tokens=True) for row in greedy]
    assert any("<answer>" in t for t in texts), texts  # the model, shown one example, answers in the format
