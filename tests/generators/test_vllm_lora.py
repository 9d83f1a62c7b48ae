"""LoRA on the vLLM generator, for real on vLLM's CPU build (.venv-vllm): a push adds the adapter as a new vLLM LoRA
adapter, and the greedy tokens and behaviour logprobs are those of the base with that adapter merged (peft's
merge_and_unload, recomputed in float32); a trainer's checkpoint directory is served by vLLM as it is."""

from __future__ import annotations

import copy
import os

import pytest

if os.environ.get("FORGE_EXP_REQUIRE_VLLM") == "1":  # .ci/run in .venv-vllm: a broken install fails, never skips
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here: these run in .venv-vllm (launchers/setup.sh --vllm)")
peft = pytest.importorskip("peft")

import torch  # noqa: E402

from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.vllm import VllmEngine  # noqa: E402
from forge_exp.models.lora import Lora, adapter_parameters, attach  # noqa: E402
from forge_exp.models.tiny import TinyQwen3  # noqa: E402
from tests.generators.test_vllm import KNOBS, MAX_LEN, check, prompts, run, sharp_model  # noqa: E402

LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": None, "layers": None}


def adapted(model, seed: int):
    """The model with a rank-8 adapter whose B is random (a fresh one's B is zero: it would change nothing)."""
    wrapped = attach(copy.deepcopy(model), Lora.of(LORA))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return wrapped


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, tokenizer = sharp_model(0)
    path = tmp_path_factory.mktemp("base")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    eng = VllmEngine(TinyQwen3(path=str(path), max_position_embeddings=MAX_LEN, lora=LORA), "cpu", seed=0, **KNOBS)
    yield eng, model, tokenizer, tmp_path_factory.mktemp("adapters")
    eng.close()


def greedy(engine, tokenizer):
    return run(engine.generate_versioned(prompts(tokenizer), Sampling(n=1, temperature=0.0, max_new_tokens=8)))


def test_pushed_adapters_generate_as_the_merged_model(setup):
    engine, base, tokenizer, _ = setup
    layout = engine.parameters()
    base_rows = greedy(engine, tokenizer)
    for version, seed in ((1, 1), (2, 2)):
        wrapped = adapted(base, seed)
        published = adapter_parameters(wrapped)
        assert [(n, tuple(t.shape)) for n, t in layout.items()] == [(n, tuple(t.shape)) for n, t in published.items()]
        assert engine.load_weights(published.items()) == version
        merged = copy.deepcopy(wrapped).merge_and_unload().eval()
        rows = greedy(engine, tokenizer)
        for p, (row,) in zip(prompts(tokenizer), rows):
            check(merged, p, row.generation.token_ids, row.generation.logprobs, 0.0, greedy=True)
            assert row.spans[0].version == version
        assert [r[0].generation.token_ids for r in rows] != [r[0].generation.token_ids for r in base_rows]


def test_a_checkpoint_directory_is_a_vllm_adapter(setup):
    from vllm.lora.request import LoRARequest

    engine, base, tokenizer, tmp = setup
    wrapped = adapted(base, 3)
    wrapped.save_pretrained(tmp / "step_3", save_embedding_layers=False)  # what HFTrainer.save writes (LoRA)
    request = LoRARequest("checkpoint", 1000, str(tmp / "step_3"))
    assert engine._run(engine._engine.add_lora(request))
    engine._adapters.serving(request, 1000)
    merged = copy.deepcopy(wrapped).merge_and_unload().eval()
    for p, (row,) in zip(prompts(tokenizer), greedy(engine, tokenizer)):
        check(merged, p, row.generation.token_ids, row.generation.logprobs, 0.0, greedy=True)
