"""Every config composes into its schema; group choices are never overridden by settings meant for another choice;
the used-by command composes a real experiment; the embedded default is what it was."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from forge_exp.config.algorithm import RLAlgorithm, SFTAlgorithm
from forge_exp.config.dataset import ArithmeticDataset, FileDataset, HubDataset
from forge_exp.config.model import PretrainedModel, TinyModel
from forge_exp.config.validate import validate
from tests.config.helpers import compose_cfg, options

GROUPS = ["model", "algorithm", "reward", "dataset", "parallelism", "services", "cluster", "trainer", "generator"]


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_into_its_schema(group, option):
    extra = {  # what an option needs beside it: model=hf names its weights, a sharded layout the trainer that shards
        ("model", "hf"): ["model.hf_id=org/model"],
        ("parallelism", "fsdp"): ["trainer=titan", "services.trainer.procs=2"],
        ("parallelism", "tp"): ["trainer=titan", "services.trainer.procs=2"],
        ("parallelism", "fsdp_tp"): ["trainer=titan", "services.trainer.procs=4"],
    }.get((group, option), [])
    typed = OmegaConf.to_object(compose_cfg(f"{group}={option}", *extra))
    assert getattr(typed, group).name == option


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes_and_validates(experiment):
    config = validate(compose_cfg(f"experiment={experiment}"))
    assert config.name == experiment


def test_the_embedded_default_is_the_tiny_experiment():
    c = validate(compose_cfg())
    assert isinstance(c.model, TinyModel) and isinstance(c.dataset, ArithmeticDataset)
    assert (c.steps, c.services.name, c.trainer.name, c.generator.name) == (250, "cpu", "hf", "torch")
    assert c.cluster.name == "local"  # every mesh on this host
    a = c.algorithm
    # the tiny model's settings, from model_algorithm/tiny_grpo.yaml
    assert (a.name, a.lr, a.prompts_per_step, a.group_size, a.dynamic_sampling, a.beta) == (
        "grpo", 1e-4, 32, 8, True, 0.0)
    ws = c.model.warmstart
    assert (ws.steps, ws.lr, ws.batch_size, ws.target_accuracy) == (1200, 1e-3, 64, 0.3)
    assert (c.dataset.digits, c.dataset.ops, c.dataset.eval_size, c.dataset.max_new_tokens) == (2, "+", 200, 8)


def test_the_used_by_command_composes_a_real_experiment():
    """forge-exp algorithm=grpo model=qwen3_1_7b: Qwen3-1.7B from its checkpoint (no tiny dims), GRPO's own
    defaults, GSM8K with the math reward and reasoning lengths, one GPU."""
    cfg = compose_cfg("algorithm=grpo", "model=qwen3_1_7b")
    c = OmegaConf.to_object(cfg)
    assert isinstance(c.model, PretrainedModel) and c.model.hf_id == "Qwen/Qwen3-1.7B"
    assert not any(k in cfg.model for k in ("hidden_size", "num_layers", "max_position_embeddings", "warmstart"))
    a = c.algorithm
    assert (a.lr, a.beta, a.prompts_per_step, a.dynamic_sampling) == (1e-6, 0.04, 16, False)
    assert (a.loss.clip_low, a.loss.clip_high, a.loss.kl_estimator.value, a.loss.loss_agg.value) == (
        0.2, 0.2, "k3", "seq_mean")
    assert isinstance(c.dataset, HubDataset) and (c.dataset.path, c.dataset.max_new_tokens) == ("openai/gsm8k", 1024)
    assert c.reward.name == "math" and c.services.name == "single_gpu"
    assert c.services.trainer.gpus == c.services.generator.gpus == 1


@pytest.mark.parametrize("algorithm", [o for o in options("algorithm") if o != "sft"])
def test_an_explicit_algorithm_keeps_its_own_knobs_on_the_tiny_model(algorithm):
    """Only the tiny model's lr and batch come from the pair's specialised config; the loss is the algorithm's."""
    own = OmegaConf.load(f"conf/algorithm/{algorithm}.yaml")  # what the option changes from its schemas' defaults
    c = OmegaConf.to_object(compose_cfg(f"algorithm={algorithm}"))
    real = OmegaConf.to_object(compose_cfg(f"algorithm={algorithm}", "model=qwen3_0_6b"))
    assert c.algorithm.lr == 1e-4 and c.algorithm.prompts_per_step == 32
    assert real.algorithm.lr == own.get("lr", RLAlgorithm.lr)
    tiny, alone = dataclasses.asdict(c.algorithm.loss), dataclasses.asdict(real.algorithm.loss)
    assert (tiny.pop("horizon"), alone.pop("horizon")) == (c.dataset.max_new_tokens, real.dataset.max_new_tokens)
    if algorithm == "grpo":  # the embedded default (tiny + grpo) runs without the reference model: tiny_grpo.yaml
        assert tiny.pop("beta") == 0.0 and alone.pop("beta") == 0.04
    assert tiny == alone
    for key, value in own.get("loss", {}).items():
        got = getattr(real.algorithm.loss, key)
        assert getattr(got, "value", got) == value, key


def test_a_group_on_the_command_line_wins_over_the_models_default_task():
    c = OmegaConf.to_object(compose_cfg("model=qwen3_1_7b", "dataset=math", "reward=math_thinking", "services=cpu"))
    assert (c.dataset.name, c.reward.name, c.services.name) == ("math", "math_thinking", "cpu")


def test_sft_and_files_compose_with_the_tiny_model():
    c = OmegaConf.to_object(compose_cfg("algorithm=sft", "dataset=jsonl", "dataset.train_path=a/train.jsonl",
                                        "dataset.eval_path=a/test.jsonl"))
    assert isinstance(c.algorithm, SFTAlgorithm) and isinstance(c.dataset, FileDataset)
    assert (c.dataset.train_path, c.dataset.eval_path, c.dataset.template) == ("a/train.jsonl", "a/test.jsonl",
                                                                              "{question}")
    assert c.dataset.use_chat_template is False  # the tiny tokenizer has no chat template: model_dataset/tiny_jsonl


def test_aliases_are_the_same_node_as_the_loss_knobs():
    a = compose_cfg("algorithm.beta=0.1", "algorithm.clip_high=0.28")
    b = compose_cfg("algorithm.loss.beta=0.1", "algorithm.loss.clip_high=0.28")
    assert OmegaConf.to_yaml(a) == OmegaConf.to_yaml(b)
    assert "beta" not in a.algorithm and a.algorithm.loss.beta == 0.1


def test_the_horizon_follows_the_response_budget():
    c = OmegaConf.to_object(compose_cfg("algorithm=dr_grpo", "dataset.max_new_tokens=12"))
    assert c.algorithm.loss.horizon == 12
    c = OmegaConf.to_object(compose_cfg("algorithm=dr_grpo", "env=calculator", "env.max_total_tokens=80"))
    assert c.algorithm.loss.horizon == 80 == c.env.response_budget(c.dataset)
    assert OmegaConf.to_object(compose_cfg("algorithm=dr_grpo", "algorithm.horizon=7")).algorithm.loss.horizon == 7


def test_the_tool_experiment_is_multi_turn_on_the_tool_alphabet():
    from forge_exp.choices import TOOL_ALPHABET
    from forge_exp.runtime.layout import plan_for

    config = validate(compose_cfg("experiment=tool_arithmetic"))
    assert config.model.alphabet == TOOL_ALPHABET and config.env.multi_turn and config.env.demonstrations > 0
    services = {name for plan in plan_for(config).values() for name in plan.services}
    assert "env" in services and "reward" not in services  # environment workers score their own episodes
    assert not validate(compose_cfg()).env.multi_turn  # the default stays single-turn
