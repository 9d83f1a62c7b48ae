"""ModelConfig checks, build_model/build_tokenizer, the tiny Qwen3 builder and the conf/model YAMLs."""

from dataclasses import fields
from pathlib import Path

import pytest
import torch
import yaml
from transformers import Qwen3ForCausalLM

from forge_exp.config.model import ModelConfig, build_model, build_tokenizer
from forge_exp.models.hf import check_model_available
from forge_exp.models.tiny import qwen3_tiny

CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "fp8"}, "model.dtype must be one of float32, bfloat16, float16, got 'fp8'"),
        ({"source": "vllm"}, "model.source must be one of tiny, hf, got 'vllm'"),
        ({"attn_implementation": "flash"}, "model.attn_implementation must be one of sdpa, eager"),
        ({"num_heads": 4, "num_kv_heads": 3}, "model.num_heads (4) must be a multiple of model.num_kv_heads (3)"),
        ({"hidden_size": 0}, "model.hidden_size must be a positive integer, got 0"),
        ({"head_dim": 7}, "model.head_dim must be even"),
    ],
)
def test_model_config_errors_name_the_key(kwargs, message):
    with pytest.raises(ValueError) as err:
        ModelConfig(**kwargs)
    assert message in str(err.value)


def test_build_model_tiny_follows_the_config_and_seed():
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    model, tok = build_model(cfg)
    assert isinstance(model, Qwen3ForCausalLM) and model.dtype == torch.float32
    c = model.config
    sizes = (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    assert sizes == (32, 2, 2, 1, 16)
    assert c.vocab_size == len(tok) and c.eos_token_id == tok.eos_token_id and c.pad_token_id == tok.pad_token_id
    same, _ = build_model(cfg)
    other, _ = build_model(ModelConfig(**{**cfg.__dict__, "seed": 1}))
    w = model.model.embed_tokens.weight
    assert torch.equal(w, same.model.embed_tokens.weight)
    assert not torch.equal(w, other.model.embed_tokens.weight)
    assert build_tokenizer(cfg).get_vocab() == tok.get_vocab()


def test_seeded_init_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    qwen3_tiny(vocab_size=20, pad_id=0, bos_id=2, eos_id=1, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_default_tiny_matches_tiny_yaml_and_is_small():
    data = yaml.safe_load((CONF_MODEL / "tiny.yaml").read_text())
    cfg = ModelConfig(**data)
    assert cfg == ModelConfig()  # the schema defaults are the default experiment's model
    model, tok = build_model(cfg)
    reference = qwen3_tiny(vocab_size=len(tok), pad_id=0, bos_id=2, eos_id=1, seed=0)
    assert model.config.to_dict()["hidden_size"] == reference.config.hidden_size
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    assert 2e5 < sum(p.numel() for p in model.parameters()) < 2e6


@pytest.mark.parametrize("path", sorted(CONF_MODEL.glob("*.yaml")), ids=lambda p: p.stem)
def test_model_yamls_are_plain_model_configs(path):
    data = yaml.safe_load(path.read_text())
    assert set(data) <= {f.name for f in fields(ModelConfig)}, "unknown keys"
    assert data["name"] == path.stem and data["path"] is None
    assert "defaults" not in data and "_target_" not in data
    if path.stem == "hf":  # the generic entry needs a path or hub id from the command line
        with pytest.raises(ValueError, match="model.source=hf needs model.hf_id .* or model.path"):
            check_model_available(ModelConfig(**data))
    elif path.stem != "tiny":
        cfg = ModelConfig(**data)
        assert cfg.source == "hf" and cfg.dtype == "bfloat16"
        assert cfg.hf_id.split("/")[0] in ("Qwen", "meta-llama")


def test_all_listed_model_yamls_exist():
    names = {p.stem for p in CONF_MODEL.glob("*.yaml")}
    assert {"tiny", "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "llama3_2_1b", "llama3_1_8b", "hf"} <= names
