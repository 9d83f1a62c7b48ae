"""models/qwen3.py against transformers' Qwen3ForCausalLM on the same weights: logits (causal, left-padded, packed,
with a KV cache), gradients, sampled tokens, and checkpoints read and written both ways."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config as HFConfig, Qwen3ForCausalLM as HFQwen3

from forge_exp.models.generate import generate, left_pad, positions_from_mask
from forge_exp.models.qwen3 import Qwen3ForCausalLM
from tests.models.helpers import PROMPTS, TOK, encode, peaky_model


def hf_twin(model, tmp_path, attn="sdpa"):
    """transformers' model loaded from what `model` saved: the same weights in the other implementation."""
    model.save_pretrained(tmp_path / "saved")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32,
                                                attn_implementation=attn).eval()


@pytest.fixture
def pair(tmp_path):
    ours = peaky_model(seed=3)
    return ours, hf_twin(ours, tmp_path)


def test_saved_checkpoint_is_a_transformers_qwen3(pair, tmp_path):
    ours, theirs = pair
    assert isinstance(theirs, HFQwen3)
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert set(theirs.state_dict()) == set(ours.state_dict())
    for name, t in ours.state_dict().items():
        assert torch.equal(theirs.state_dict()[name], t), name


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logits_match_causal_padded_and_cached(tmp_path, attn):
    ours = peaky_model(seed=3)
    ours.config.attn_implementation = attn
    theirs = hf_twin(ours, tmp_path, attn)
    ids = torch.tensor([encode(["905*12=37"])[0]] * 2)
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=1e-5, rtol=0)
        # left padding: rows of different lengths, positions from the mask
        ids, mask = left_pad(encode(PROMPTS), 0)
        pos = positions_from_mask(mask)
        a = ours(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        b = theirs(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        assert torch.allclose(a[mask], b[mask], atol=1e-5, rtol=0)
        assert not torch.isnan(a).any()  # pad rows included
        # one more token through the cache of the padded prefill
        cache = ours.new_cache()
        ours(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        nxt = torch.full((len(ids), 1), 5)
        mask2 = torch.cat([mask, torch.ones(len(ids), 1, dtype=torch.bool)], 1)
        step = ours(input_ids=nxt, attention_mask=mask2, position_ids=pos[:, -1:] + 1, past_key_values=cache,
                    use_cache=True).logits
        full = theirs(input_ids=torch.cat([ids, nxt], 1), attention_mask=mask2,
                      position_ids=torch.cat([pos, pos[:, -1:] + 1], 1)).logits[:, -1:]
        assert torch.allclose(step, full, atol=1e-5, rtol=0)


def test_packed_rows_attend_within_their_own_example(pair):
    ours, theirs = pair
    a, b = encode(["37+48=85", "12/3=4"])
    ids = torch.tensor([a + b])
    pos = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        packed = ours(input_ids=ids, position_ids=pos).logits
        alone = ours(input_ids=torch.tensor([b])).logits
        assert torch.allclose(packed[0, len(a):], alone[0], atol=1e-5, rtol=0)
        # transformers detects the packing only without a cache, as trainers/sft.py calls it
        assert torch.allclose(packed, theirs(input_ids=ids, position_ids=pos, use_cache=False).logits, atol=1e-5,
                              rtol=0)


def test_gradients_match(pair):
    ours, theirs = pair
    ids, mask = left_pad(encode(PROMPTS), 0)
    pos = positions_from_mask(mask)
    grads = []
    for model in (ours, theirs):
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        torch.log_softmax(logits, -1)[mask][:, 7].sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-4, rtol=1e-4), name


def test_sampled_tokens_and_logprobs_match(pair):
    ours, theirs = pair
    runs = [generate(m, encode(PROMPTS), max_new_tokens=8, eos_id=TOK.eos_token_id, pad_id=0, seed=11)
            for m in (ours, theirs)]
    assert [g.token_ids for g in runs[0]] == [g.token_ids for g in runs[1]]
    for g, h in zip(*runs):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(h.logprobs), atol=1e-5)


def test_reads_what_transformers_wrote(tmp_path):
    config = HFConfig(vocab_size=len(TOK), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    torch.manual_seed(0)
    theirs = HFQwen3(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = Qwen3ForCausalLM.from_pretrained(tmp_path)
    assert ours.config.rope_theta == 5000.0 and not ours.config.tie_word_embeddings
    ids = torch.tensor(encode(PROMPTS[:1]))
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=1e-5, rtol=0)
    half = Qwen3ForCausalLM.from_pretrained(tmp_path, torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def test_what_it_cannot_read_is_one_line_naming_the_file(pair, tmp_path):
    saved = tmp_path / "saved"
    config = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**config, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}))
    with pytest.raises(ValueError, match=r"saved/config.json: rope type 'yarn' is not supported"):
        Qwen3ForCausalLM.from_pretrained(saved)
    (saved / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ValueError, match=r"model_type is 'llama', not 'qwen3'"):
        Qwen3ForCausalLM.from_pretrained(saved)
    (saved / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    weights = load_file(saved / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, saved / "model.safetensors")
    with pytest.raises(ValueError, match=r"the weights lack model.norm.weight"):
        Qwen3ForCausalLM.from_pretrained(saved)


def test_activation_checkpointing_gives_the_same_gradients(pair):
    ours, _ = pair
    ids = torch.tensor(encode(PROMPTS[:2] * 2)[:1] * 2)
    grads = []
    for on in (False, True):
        ours.model.gradient_checkpointing = on
        ours.train().zero_grad()
        ours(input_ids=ids).logits.logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for p in ours.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_non_default_rope_theta_and_dtype_reach_transformers(tmp_path):
    from forge_exp.models.qwen3_config import Qwen3Config

    torch.manual_seed(0)
    ours = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16, rope_theta=500.0))
    theirs = hf_twin(ours, tmp_path)
    assert theirs.config.rope_parameters["rope_theta"] == 500.0
    ids = torch.tensor(encode(PROMPTS[1:2]))
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=1e-5, rtol=0)
    ours.to(torch.bfloat16).save_pretrained(tmp_path / "half")
    assert json.loads((tmp_path / "half" / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_fresh_tiny_model_is_transformers_init_under_the_same_seed():
    """The default's warm start (and so its whole run) starts from the numbers transformers' model would draw."""
    from forge_exp.models.tiny import qwen3

    ours = qwen3(vocab_size=len(TOK), hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=96, max_position_embeddings=64, pad_id=0, bos_id=2, eos_id=1, seed=5)
    config = HFConfig(vocab_size=len(TOK), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    torch.manual_seed(5)
    theirs = HFQwen3(config)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    for name, t in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], t), name
