"""The model specs conf/model/*.yaml build (models/tiny.py: TinyQwen3, models/hf.py: Pretrained)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from forge_exp.models.hf import Pretrained
from forge_exp.models.precision import auto_dtype
from forge_exp.models.qwen3 import Qwen3ForCausalLM
from forge_exp.models.tiny import TinyQwen3
from forge_exp.runtime.build import build
from tests.config.helpers import compose_cfg, options
from tests.models.helpers import build_tiny


def test_tiny_follows_its_sizes_and_seed():
    sizes = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    model, tok = build_tiny(**sizes)
    assert isinstance(model, Qwen3ForCausalLM) and model.dtype == torch.float32
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        32, 2, 2, 1, 16)
    assert c.vocab_size == len(tok) and c.eos_token_id == tok.eos_token_id and c.pad_token_id == tok.pad_token_id
    same, _ = build_tiny(**sizes)
    other, _ = build_tiny(**sizes, seed=1)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, same.model.embed_tokens.weight) and not torch.equal(w, other.model.embed_tokens.weight)
    assert TinyQwen3(dtype="bfloat16").build().dtype == torch.bfloat16
    assert TinyQwen3().random_init and not TinyQwen3(path="/x").random_init


def test_seeded_init_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    TinyQwen3(seed=5).build()
    assert torch.equal(torch.rand(3), expected)


def test_tiny_yaml_builds_the_default_model():
    spec = build(OmegaConf.to_object(compose_cfg()).model, "model")
    assert spec == TinyQwen3()  # the pure defaults are the default experiment's model
    model = spec.build()
    assert 2e5 < sum(p.numel() for p in model.parameters()) < 2e6


@pytest.mark.parametrize("name", [o for o in options("model") if o not in ("tiny", "hf")])
def test_real_model_yamls_build_pretrained_specs(name, tmp_path):
    spec = build(OmegaConf.to_object(compose_cfg(f"model={name}")).model, "model")
    # dtype auto: what this machine computes natively (models/precision.py)
    assert isinstance(spec, Pretrained) and spec.dtype == auto_dtype(False)[0] and spec.path is None
    assert spec.hf_id.split("/")[0] in ("Qwen", "meta-llama", "HuggingFaceTB")
    with pytest.raises(ValueError, match=r"model\.path is not set and .* is not in the local Hugging Face cache"):
        spec.check_available()


def test_all_listed_model_yamls_exist():
    names = set(options("model"))
    assert {"tiny", "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "llama3_2_1b", "llama3_1_8b", "hf"} <= names
