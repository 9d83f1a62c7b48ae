"""Real model families, offline: a tiny Qwen3 and a tiny Llama saved with `save_pretrained`, with byte-level BPE
tokenizers and chat templates built here, go through the same code path as `model=qwen3_1_7b model.path=<dir>`:
composition, validation (check_model_available), build_model, chat-template prompts, generation, a GRPO step —
in process, and once through the real `forge-exp` CLI. HF checkpoints round-trip through plain
`AutoModelForCausalLM.from_pretrained` with identical logits.

The helpers (`save_tiny_family`, `write_gsm8k_jsonl`, ...) are used by tests/apps and tests/e2e too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from forge_exp.config.store import register
from forge_exp.config.validate import validate
from forge_exp.models.precision import auto_dtype
from tests.config.helpers import compose_cfg
from tests.conftest import CONF, ROOT

register()

# Qwen3's template, cut down, with its quirk: the last assistant turn gets an empty <think></think> block that the
# same turn does not get inside a longer conversation.
QWEN3_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Llama 3's template, cut down: the tokenizer adds <|begin_of_text|> itself; turns end with <|eot_id|> (= eos).
LLAMA3_TEMPLATE = (
    "{%- for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CORPUS = [
    "You are a helpful assistant. First reason about the problem step by step inside <think> </think> tags, "
    "then give only the final answer inside <answer> </answer> tags.",
    "Natalia sold 48 clips in April and half as many in May. How many clips did she sell altogether?",
    "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in all. #### 72",
    "What is 6 times 7? The answer is 42. user assistant system 0123456789 + - * / = ( ) , . ? !",
]
FAMILIES = {
    # family: (model yaml, HF class, specials, eos, pad, bos, template)
    "qwen3": ("qwen3_1_7b", Qwen3ForCausalLM, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              "<|im_end|>", "<|endoftext|>", None, QWEN3_TEMPLATE),
    "llama": ("llama3_8b", LlamaForCausalLM, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                             "<|end_header_id|>", "<|eot_id|>"],
              "<|eot_id|>", None, "<|begin_of_text|>", LLAMA3_TEMPLATE),
}


def byte_bpe_tokenizer(specials: list[str], eos: str, pad: str | None, bos: str | None, template: str):
    """A byte-level BPE tokenizer trained on CORPUS (every byte is in the base alphabet, so any text encodes),
    with `template` as its chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if bos:  # Llama: the tokenizer prepends <|begin_of_text|>
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=bos, chat_template=template,
        clean_up_tokenization_spaces=False,
    )


def tiny_family(family: str, seed: int = 0):
    """(model, tokenizer) of a randomly initialised tiny model of a real family, float32."""
    _, cls, specials, eos, pad, bos, template = FAMILIES[family]
    tokenizer = byte_bpe_tokenizer(specials, eos, pad, bos, template)
    sizes = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=family == "qwen3",
    )
    config = Qwen3Config(**sizes) if family == "qwen3" else LlamaConfig(**sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.eval(), tokenizer


def save_tiny_family(family: str, directory: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save a tiny model of `family` the way a Hub checkpoint is (bf16 safetensors + tokenizer files)."""
    model, tokenizer = tiny_family(family)
    model.to(dtype).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_gsm8k_jsonl(directory: Path, train: int = 24, test: int = 8, digits: bool = False) -> list[str]:
    """GSM8K-format rows (question, answer ending in "#### <n>") as train.jsonl and test.jsonl; returns the
    overrides that point dataset=jsonl at them. digits=True writes questions the tiny model's character tokenizer
    can read ("3+4=")."""
    def row(a: int, b: int) -> dict:
        question = f"{a}+{b}=" if digits else f"what is {a} plus {b}?"
        return {"question": question, "answer": f"{a} plus {b} is {a + b}\n#### {a + b}"}

    directory.mkdir(parents=True, exist_ok=True)
    for split, pairs in (("train", [(i, i + 3) for i in range(train)]), ("test", [(i, 2 * i) for i in range(test)])):
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(row(a, b)) + "\n" for a, b in pairs))
    return ["dataset=jsonl", f"dataset.train_path={directory / 'train.jsonl'}",
            f"dataset.eval_path={directory / 'test.jsonl'}"]


def real_overrides(family: str, path: Path, data: list[str]) -> list[str]:
    return [f"model={FAMILIES[family][0]}", f"model.path={path}", *data,
            "dataset.target_format=gsm8k", "dataset.max_new_tokens=12", "reward=math", "services=cpu",
            "dataset.max_prompt_tokens=256",  # prompt + response within the stand-in checkpoint's 512 positions
            "algorithm.beta=0.04", "algorithm.group_size=4", "algorithm.prompts_per_step=2", "algorithm.lr=1e-3"]


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("family", ["tiny", "qwen3", "llama"])
def test_hf_checkpoint_reloads_with_plain_transformers_and_identical_logits(family, tmp_path):
    from forge_exp.models.checkpoint import save_hf_checkpoint
    from tests.models.helpers import build_from, build_tiny

    model, tokenizer = build_tiny() if family == "tiny" else tiny_family(family)
    path = save_hf_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in path.iterdir()
    }
    reloaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    assert type(reloaded).__name__ == type(model).__name__  # the tiny model: models/qwen3.py's, read by transformers'
    ids = torch.tensor([tokenizer("what is 6 plus 7? 13")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, reloaded(ids).logits)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert tok("what is 6 plus 7?")["input_ids"] == tokenizer("what is 6 plus 7?")["input_ids"]
    assert tok.eos_token_id == tokenizer.eos_token_id and tok.chat_template == tokenizer.chat_template
    # and as `model.path=<dir>`, the way every service loads it
    again, _ = build_from(path)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, reloaded(ids).logits)


# ---------------------------------------------------------------------------------------------- the code path
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_real_family_through_its_model_config_generates_and_takes_a_grpo_step(family, tmp_path):
    from forge_exp.data.collate import collate_episodes
    from forge_exp.models.generate import generate
    from forge_exp.rewards.combine import score_group
    from forge_exp.rl.episodes import group_advantages, penalize_overlong, to_episodes
    from forge_exp.rl.types import Completion, Group
    from forge_exp.trainers.update import Policy, policy_update
    from forge_exp.runtime.build import build, build_reward

    yaml_name, cls = FAMILIES[family][:2]
    path = save_tiny_family(family, tmp_path / "model")
    config = validate(compose_cfg(*real_overrides(family, path, write_gsm8k_jsonl(tmp_path / "data"))))
    spec = build(config.model, "model")
    # model.dtype=auto: bf16 where it is native, float32 on a CPU without it (models/precision.py)
    expected = auto_dtype(torch.cuda.is_available())[0]
    assert config.model.name == yaml_name and spec.path == str(path) and spec.dtype == expected

    model, tokenizer = spec.build(), spec.tokenizer()
    assert type(model) is cls and next(model.parameters()).dtype == getattr(torch, expected)
    train, heldout = build(config.dataset, "dataset").problems(tokenizer)
    problems = [next(iter(train())) for _ in range(config.algorithm.prompts_per_step)]
    user = [{"role": "user", "content": "q"}]
    generation_prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)[
        len(tokenizer.apply_chat_template(user, tokenize=False)):]
    assert problems[0].question in problems[0].prompt and problems[0].prompt.endswith(generation_prompt)
    assert heldout and heldout[0].target == "0"

    a = config.algorithm
    prompts = [tokenizer.encode(p.prompt) for p in problems]
    outs = generate(model, [ids for ids in prompts for _ in range(a.group_size)], max_new_tokens=12,
                    temperature=1.0, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                    generator=torch.Generator().manual_seed(0))
    assert all(1 <= len(o.token_ids) <= 12 for o in outs)
    reward = build_reward(config.reward)
    groups = []
    for i, p in enumerate(problems):
        completions = [Completion(prompts[i], o.token_ids, o.logprobs, o.stop_reason, 0,
                                  tokenizer.decode(o.token_ids, skip_special_tokens=True))
                       for o in outs[i * a.group_size : (i + 1) * a.group_size]]
        group = Group(problem=p, completions=completions)
        group.rewards, group.components, _ = score_group(reward, p, [c.text for c in completions])
        group.rewards = [float(j % 2) for j in range(a.group_size)]  # a random model scores 0: force a signal
        groups.append(group)
    if a.overlong_penalty:
        groups = penalize_overlong(groups, 12, a.overlong_buffer_len(12))
    episodes = to_episodes(groups, group_advantages(groups, a.advantage, a.advantage_eps))
    for e in episodes:  # beta > 0: the reference is the model itself before the step
        e.ref_logprobs = list(e.completion.logprobs)
    master = model.float()  # the trainer's float32 master weights; the forward runs in bf16 under autocast
    before = [p.detach().clone() for p in master.parameters()]
    policy = Policy(torch.device("cpu"), master, tokenizer, torch.optim.AdamW(master.parameters(), lr=1e-6),
                    build(a.loss, "algorithm.loss"), compute_dtype=torch.bfloat16)
    metrics = policy_update(policy, collate_episodes(episodes, tokenizer.pad_token_id),
                            grad_accum=a.grad_accum, max_grad_norm=a.max_grad_norm, temperature=a.temperature)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    # at lr 1e-6 a bf16 copy of the weights would not move; the float32 master weights do
    assert any(not torch.equal(b, p) for b, p in zip(before, master.parameters())), "the step changed nothing"


def test_real_model_config_without_local_weights_is_one_clear_error(tmp_path):
    from forge_exp.apps.preflight import check

    with pytest.raises(ValueError, match="model.path"):
        check(validate(compose_cfg("model=qwen3_1_7b", "model.hf_id=nobody/not-cached-anywhere", "services=cpu")))
    with pytest.raises(ValueError, match="has no config.json"):
        check(validate(compose_cfg("model=qwen3_1_7b", f"model.path={tmp_path}", "services=cpu")))


@pytest.mark.slow
def test_forge_exp_cli_runs_grpo_on_a_real_family_checkpoint(tmp_path):
    """`forge-exp model=qwen3_1_7b model.path=<dir>` itself: proc meshes, generation, two GRPO steps, MLflow."""
    from mlflow.tracking import MlflowClient

    path = save_tiny_family("qwen3", tmp_path / "model")
    cmd = [sys.executable, "-m", "forge_exp.cli", *real_overrides("qwen3", path, write_gsm8k_jsonl(tmp_path / "data")),
           "steps=2", "dataset.eval_size=4", "progress=false", f"hydra.run.dir={tmp_path}/run",
           f"tracking.uri=sqlite:///{tmp_path}/mlruns/mlflow.db"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.name"] == "qwen3_1_7b" and run.data.params["model.path"] == str(path)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss/total")] == [1, 2]
    assert "eval/accuracy" in run.data.metrics and "loss/kl" in run.data.metrics


def test_the_real_model_configs_exist():
    for yaml_name, *_ in FAMILIES.values():
        assert (CONF / "model" / f"{yaml_name}.yaml").is_file(), yaml_name


def test_two_actors_of_one_process_can_load_a_tied_checkpoint_at_once(tmp_path):
    """Trainer and reference model share a process (services=cpu, single_gpu) and load `model.path` at the same
    time; from_pretrained is not thread-safe, and an unguarded second load left Qwen3's tied lm_head on the meta
    device ("Cannot copy out of meta tensor")."""
    import threading

    from forge_exp.models.hf import load_causal_lm

    path = save_tiny_family("qwen3", tmp_path / "model")
    errors: list[BaseException] = []

    def load() -> None:
        try:
            load_causal_lm(str(path), "bfloat16").to("cpu")
        except BaseException as err:  # noqa: BLE001 — reported below
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
