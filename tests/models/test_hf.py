"""Local-only loading and the fast availability check the CLI runs before starting any process."""

import time

import huggingface_hub.constants
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from forge_exp.models.checkpoint import save_hf_checkpoint
from forge_exp.models.hf import ModelSpec, Pretrained, load_causal_lm, load_tokenizer
from forge_exp.models.tiny import TinyQwen3
from tests.models.helpers import build_tiny


def saved_tiny(directory):
    model, tok = build_tiny(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                            intermediate_size=64)
    return save_hf_checkpoint(model, tok, directory)


def fake_hub_cache(root, repo_id, files):
    snapshot = root / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (root / f"models--{repo_id.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo_id.replace('/', '--')}" / "refs" / "main").write_text("abc123")
    for name in files:
        (snapshot / name).write_text("{}")


def test_not_in_cache_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as err:
        Pretrained(hf_id="Qwen/Qwen3-1.7B").check_available()
    assert str(err.value) == (
        "model.path is not set and Qwen/Qwen3-1.7B is not in the local Hugging Face cache (this machine cannot "
        "reach the Hub): download it elsewhere and pass model.path=<local dir>"
    )


def test_cached_hub_model_passes_and_config_only_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    fake_hub_cache(tmp_path, "Qwen/Qwen3-0.6B", ["config.json", "model.safetensors"])
    fake_hub_cache(tmp_path, "Qwen/Qwen3-8B", ["config.json"])  # an interrupted download
    t0 = time.perf_counter()
    Pretrained(hf_id="Qwen/Qwen3-0.6B").check_available()
    assert time.perf_counter() - t0 < 1.0  # file lookups only
    with pytest.raises(ValueError, match="Qwen/Qwen3-8B is not in the local Hugging Face cache"):
        Pretrained(hf_id="Qwen/Qwen3-8B").check_available()


def test_local_path_checks(tmp_path):
    TinyQwen3().check_available()  # a tiny model is built, nothing to find
    with pytest.raises(ValueError, match=r"model.path=.*missing is not a directory"):
        TinyQwen3(path=str(tmp_path / "missing")).check_available()
    with pytest.raises(ValueError, match="has no config.json"):
        Pretrained(path=str(tmp_path)).check_available()
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no model.safetensors"):
        ModelSpec(path=str(tmp_path)).check_available()
    Pretrained(path=str(saved_tiny(tmp_path / "ok"))).check_available()


def test_damaged_files_are_named_before_loading(tmp_path):
    """A weights file cut short by a copy, or a config.json that is not JSON, is one line naming the file (read
    from the safetensors header, not the weights), not a loader's traceback in a service."""
    ok = saved_tiny(tmp_path / "ok")
    weights = ok / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(ValueError, match=rf"model\.safetensors of {size - 100} bytes where its header says {size}"):
        Pretrained(path=str(ok)).check_available()
    weights.write_bytes(b"\x05")
    with pytest.raises(ValueError, match=r"model\.safetensors of 1 bytes, too short for its own header"):
        Pretrained(path=str(ok)).check_available()
    garbage = saved_tiny(tmp_path / "garbage")
    (garbage / "config.json").write_text("garbage{")
    with pytest.raises(ValueError, match=r"model\.path=\S+garbage has a config\.json that is not JSON"):
        TinyQwen3(path=str(garbage)).check_available()


def test_load_causal_lm_options(tmp_path):
    path = str(saved_tiny(tmp_path / "m"))
    model = load_causal_lm(path, dtype="bfloat16", attn_implementation="eager", gradient_checkpointing=True)
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert not any(getattr(m, "gradient_checkpointing", False) for m in load_causal_lm(path).modules())
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_causal_lm(path, dtype="fp8")
    with pytest.raises(OSError):  # never falls back to the network
        load_causal_lm(str(tmp_path / "nothing-here"))


def test_tokenizer_without_pad_pads_with_eos(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    raw = Tokenizer(WordLevel({"a": 0, "</s>": 1, "?": 2}, unk_token="?"))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="?").save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert tok.pad_token_id == tok.eos_token_id == 1 and tok.padding_side == "left"
