"""sequence_logprobs (the trainer's side) against the generator's behaviour logprobs and a float64 reference."""

import pytest
import torch

from forge_exp.models.generate import generate, left_pad
from forge_exp.models.logprobs import sequence_logprobs
from tests.models.helpers import PROMPTS, TOK, encode, peaky_model, right_pad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_generator_behaviour_logprobs(temperature):
    model = peaky_model(seed=1)
    prompts = encode(PROMPTS * 2)
    outs = generate(model, prompts, max_new_tokens=9, temperature=temperature, eos_id=TOK.eos_token_id, pad_id=0,
                    generator=torch.Generator().manual_seed(4))
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad([o.token_ids for o in outs], 0)
    behaviour = torch.zeros(response_ids.shape)
    for i, o in enumerate(outs):
        behaviour[i, : len(o.logprobs)] = torch.tensor(o.logprobs)
    logprobs, entropy = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature)
    assert logprobs.shape == entropy.shape == response_ids.shape
    assert torch.allclose(logprobs, behaviour, atol=1e-5, rtol=0)
    assert (behaviour[response_mask] < -1e-3).any()  # not a trivially certain model


def test_ragged_responses_match_a_float64_reference_per_row():
    model = peaky_model(seed=2).double()
    prompts = encode(["1+2=", "37+48=", "905*12="])
    responses = [[5, 7, 1], [9], [6, 6, 6, 6, 1]]
    temperature = 0.8
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad(responses, 0)
    logprobs, entropy = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        with torch.no_grad():  # one row alone, no padding at all: the plain definition
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1] / temperature
        ref_lp = torch.log_softmax(logits, -1)
        assert torch.allclose(logprobs[i, : len(r)].double(), ref_lp[torch.arange(len(r)), r], atol=1e-5, rtol=0)
        ref_entropy = -(ref_lp.exp() * ref_lp).sum(-1)
        assert torch.allclose(entropy[i, : len(r)].double(), ref_entropy, atol=1e-5, rtol=0)
        assert (logprobs[i, len(r) :] == 0).all() and (entropy[i, len(r) :] == 0).all()


def test_differentiable():
    model = peaky_model()
    prompt_ids, prompt_mask = left_pad(encode(["1+2=", "37+48="]), 0)
    response_ids, response_mask = right_pad([[5, 1], [7]], 0)
    logprobs, _ = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, 1.0)
    logprobs.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_unpadded_prompts_take_the_causal_path_and_match_the_masked_one():
    """Prompts of one length (no left padding) run without an attention mask: the same logprobs and entropies as
    the masked forward, and as each row alone in float64."""
    model = peaky_model(seed=3).double()
    prompts = encode(["12+34=", "56+78=", "90+11="])
    responses = [[5, 7, 1], [9], [6, 6, 6, 6, 1]]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    assert prompt_mask.all()
    response_ids, response_mask = right_pad(responses, 0)
    causal = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, 0.9)
    # a response mask with a hole is not a prefix: the masked path, which must agree on the real tokens
    holed = response_mask.clone()
    holed[2, 4] = False
    masked = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, holed, 0.9)
    keep = holed & response_mask
    for a, b in zip(causal, masked):
        assert torch.allclose(a[keep], b[keep], atol=1e-6, rtol=0)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1] / 0.9
        ref = torch.log_softmax(logits, -1)
        assert torch.allclose(causal[0][i, : len(r)].double(), ref[torch.arange(len(r)), r], atol=1e-5, rtol=0)
        assert torch.allclose(causal[1][i, : len(r)].double(), -(ref.exp() * ref).sum(-1), atol=1e-5, rtol=0)


def _transformers_llama(attention: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM._from_config(config, attn_implementation=attention).eval()


@pytest.mark.parametrize("model", ["qwen3 sdpa", "qwen3 eager", "transformers sdpa", "transformers eager"])
def test_shared_prompts_give_the_separate_rows_logprobs_entropies_and_gradients(model):
    """trainer.share_prompts: rows 0, 2, 5 share a prompt and rows 1, 4 another (not adjacent, prompts of different
    lengths, so left padding differs): the same values and gradients as the rows run one by one, from forge-exp's
    own Qwen3 and from transformers' Llama under either attention, in fewer, longer sequences. Float32 (both models'
    norms compute in float32 whatever the weights: gradients summed in another order differ by ~1e-7)."""
    family, attention = model.split()
    net = peaky_model(seed=4) if family == "qwen3" else _transformers_llama(attention)
    if family == "qwen3":
        net.config.attn_implementation = attention
        for layer in net.model.layers:
            layer.self_attn.eager = attention == "eager"
    prompts = encode(["37+48=", "1+2=", "37+48=", "905*12=", "1+2=", "37+48="])
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad([[5, 7, 1], [9], [6, 6, 6, 6, 1], [4, 4], [8, 1], [3]], 0)
    weights = torch.randn(response_ids.shape, generator=torch.Generator().manual_seed(0))
    got = {}
    for share in (False, True):
        net.zero_grad()
        shapes = []
        hook = net.get_decoder().register_forward_pre_hook(
            lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        lp, ent = sequence_logprobs(net, prompt_ids, prompt_mask, response_ids, response_mask, 0.8,
                                    share_prompts=share)
        hook.remove()
        ((lp + ent) * weights).sum().backward()
        got[share] = lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in net.named_parameters()}, shapes
    (lp0, ent0, grads0, shapes0), (lp1, ent1, grads1, shapes1) = got[False], got[True]
    assert torch.allclose(lp1, lp0, atol=1e-5, rtol=0) and torch.allclose(ent1, ent0, atol=1e-5, rtol=0)
    assert (lp0[response_mask] < -1e-3).any()  # not a trivially certain model
    for name, grad in grads0.items():
        assert grad.norm() > 0 and (grads1[name] - grad).norm() <= 1e-5 * grad.norm(), name
    assert shapes0 == [(6, prompt_ids.shape[1] + response_ids.shape[1] - 1)]
    assert shapes1 == [(3, len(prompts[0]) + 3 + 5 + 1)]  # "37+48=" and its three responses: the longest sequence


def test_shared_prompts_refuse_a_head_they_would_not_run():
    model = peaky_model()
    model.lm_head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    prompt_ids, prompt_mask = left_pad(encode(["1+2=", "1+2="]), 0)
    response_ids, response_mask = right_pad([[5, 1], [7]], 0)
    with pytest.raises(ValueError, match=r"^trainer\.share_prompts=true: Qwen3ForCausalLM applies its own LM head"):
        sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts=True)


@pytest.mark.parametrize("share", [False, True])
def test_the_head_runs_on_the_responses_own_tokens_not_their_padding(monkeypatch, share):
    from forge_exp.models import logprobs as module

    rows, head = [], module.head_logprobs
    monkeypatch.setattr(module, "head_logprobs", lambda hidden, *args: rows.append(len(hidden)) or head(hidden, *args))
    model = peaky_model()
    prompt_ids, prompt_mask = left_pad(encode(["1+2=", "37+48=", "1+2="]), 0)
    response_ids, response_mask = right_pad([[5, 7, 1], [9], [6, 6, 6, 6, 6, 6, 1]], 0)  # 11 tokens of 3 x 7
    lp, ent = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts=share)
    assert rows == [11] and (lp[response_mask] < 0).all() and (lp[~response_mask] == 0).all()
    assert (ent[~response_mask] == 0).all() and (ent[response_mask] > 0).all()
