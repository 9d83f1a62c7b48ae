"""A real pretrained model, offline: SmolLM2-135M-Instruct from its GGUF file (tests/models/smollm2.py). The file
dequantizes once into a plain HF checkpoint that equals transformers' own GGUF load; the trainer's checkpoints of it
reload in transformers with identical logits; its chat template formats the reasoning-gym prompts, and the answers
read from its real output are the ones reasoning-gym's own parser reads. A .gguf that cannot be used is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from forge_exp.models import gguf
from forge_exp.models.hf import Pretrained

pytestmark = pytest.mark.slow  # a 93 MB download once per machine, ~40 s of conversion, a 135M-parameter model


def test_the_gguf_file_becomes_a_plain_hf_checkpoint_equal_to_transformers_own_load(smollm2, smollm2_gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((Path(smollm2) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert json.loads((Path(smollm2) / gguf.SOURCE_FILE).read_text())["file"] == str(Path(smollm2_gguf).resolve())
    assert gguf.ensure_converted(smollm2_gguf) == Path(smollm2)  # cached: the same folder, nothing converted again
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert "<|im_start|>" in tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer(["What is 17 + 25?"], return_tensors="pt")["input_ids"]
    ours = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(Path(smollm2_gguf).parent, gguf_file=Path(smollm2_gguf).name,
                                                  dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_model_path_may_name_the_gguf_file(smollm2, smollm2_gguf):
    from forge_exp.apps.preflight import resolve_model
    from forge_exp.config.compose import typed
    from forge_exp.models.precision import auto_dtype

    config = typed(["model=smollm2_135m", f"model.path={smollm2_gguf}", "dataset.tasks=[chain_sum]"])
    notes = resolve_model(config)
    dtype, _ = auto_dtype(on_gpu=False)  # float32 where the CPU has no native bf16 (most 2-core machines here)
    assert config.model.path == smollm2 and config.model.dtype.value == dtype
    assert notes[0].endswith(f"loaded from its HF checkpoint {smollm2}") and f"model.dtype=auto: {dtype}" in notes[1]
    assert Pretrained(path=smollm2).tokenizer().chat_template


def test_a_gguf_that_cannot_be_used_is_one_line(tmp_path, monkeypatch):
    import gguf as gguf_lib

    with pytest.raises(ValueError, match=r"model.path=.*missing.gguf: no such file"):
        gguf.check_gguf(str(tmp_path / "missing.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ValueError, match=r"junk.gguf: not a readable GGUF file"):
        gguf.check_gguf(str(junk))
    bert = tmp_path / "bert.gguf"  # a real GGUF file of an architecture transformers' GGUF reader lacks
    writer = gguf_lib.GGUFWriter(str(bert), "bert")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"bert.gguf: transformers cannot load GGUF architecture 'bert' \(it reads "
                                         r".*llama.*\)"):
        gguf.check_gguf(str(bert))
    monkeypatch.setattr(gguf, "_importable", lambda name: name != "accelerate")
    with pytest.raises(ValueError, match=r"needs accelerate, not installed: pip install gguf accelerate"):
        gguf.check_gguf(str(bert))


def test_a_trainer_checkpoint_reloads_in_transformers_with_identical_logits(smollm2, tmp_path):
    from transformers import AutoModelForCausalLM

    from forge_exp.rl.losses import GRPOLoss
    from forge_exp.trainers.hf import HFTrainer
    from forge_exp.trainers.update import available_inputs

    trainer = HFTrainer(Pretrained(path=smollm2, dtype="float32"), GRPOLoss(beta=0.0), device=torch.device("cpu"),
                        lr=1e-5, weight_decay=0.0, loss_inputs=available_inputs(reference=False))
    with torch.no_grad():  # weights that are not the file's: the checkpoint must hold what the trainer holds
        trainer.model.model.norm.weight.mul_(1.5)
    saved = trainer.save(str(tmp_path / "ckpt"), optimizer=False)
    ids = trainer.tokenizer(["State the final answer: 4 + 5 ="], return_tensors="pt")["input_ids"]
    reloaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, trainer.model(ids).logits)


def test_chat_template_and_answer_extraction_on_the_real_models_output(smollm2):
    import asyncio

    import reasoning_gym

    from forge_exp.data.reasoning_gym import ReasoningGymProblems
    from forge_exp.generators.base import Sampling
    from forge_exp.generators.native import NativeEngine
    from forge_exp.rewards.reasoning_gym import TaskScore

    spec = Pretrained(path=smollm2, dtype="float32")
    tokenizer = spec.tokenizer()
    options = {"chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 2}}
    source = ReasoningGymProblems(tasks=["chain_sum"], task_options=options, eval_size=12, fewshot=1)
    problems = source.eval_problems(tokenizer)
    (shot_q, shot_a), = source.examples("chain_sum")
    assert problems[0].prompt == (
        "<|im_start|>system\nAnswer the question. Write the final answer inside <answer> </answer> tags.<|im_end|>\n"
        f"<|im_start|>user\n{shot_q}<|im_end|>\n<|im_start|>assistant\n{shot_a}<|im_end|>\n"
        f"<|im_start|>user\n{problems[0].question}<|im_end|>\n<|im_start|>assistant\n")
    with NativeEngine(spec, "cpu", seed=0, slots=16, max_len=256) as engine:
        out = asyncio.run(engine.generate([tokenizer(p.prompt)["input_ids"] for p in problems],
                                          Sampling(max_new_tokens=24, temperature=0.0)))
    texts = [tokenizer.decode(g[0].token_ids, skip_special_tokens=True) for g in out]
    score = TaskScore()
    tagged = 0
    for problem, text in zip(problems, texts):
        theirs = reasoning_gym.utils.extract_answer(text)  # the library's own parser
        assert score.answer(text) == theirs, text
        tagged += theirs is not None
        expected = reasoning_gym.get_score_answer_fn("chain_sum")(theirs, problem.info)
        assert score(problem.prompt, text, problem.target, problem) == expected
    assert tagged >= 3, texts  # shown one solved example, the model mostly answers in the tags
