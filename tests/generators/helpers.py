"""Engines and eager references shared by the generator tests: small models with far-from-uniform next-token
distributions (so a wrong position, mask or key changes tokens visibly)."""

import asyncio

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from forge_exp.generators.base import Sampling
from forge_exp.generators.native import NativeEngine
from forge_exp.models.generate import generate
from tests.models.helpers import PROMPTS, TOK, encode, peaky_model


def peaky(model):
    """Large random weights (std 0.3) on every matrix, seeded by the model's own seed stream."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def tiny_llama(seed: int = 0):
    config = LlamaConfig(vocab_size=len(TOK), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peaky(LlamaForCausalLM(config))


def tiny_qwen2(seed: int = 0):
    """Qwen2: the Llama layout plus q/k/v biases."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(TOK), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peaky(Qwen2ForCausalLM(config))
    with torch.no_grad():  # biases are vectors, which peaky leaves at zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


def engine(model, **knobs):
    knobs.setdefault("max_len", 64)
    return NativeEngine.from_model(model, TOK, seed=0, **knobs)


def eager(model, prompts, sampling: Sampling, eos=None):
    """The reference: each prompt repeated n times, one eager batch, the same seed."""
    rows = [p for p in prompts for _ in range(sampling.n)]
    out = generate(model, rows, max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                   top_p=sampling.top_p, eos_id=TOK.eos_token_id if eos is None else eos, pad_id=0,
                   seed=sampling.seed)
    return [out[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]


def assert_same(got, want):
    """Same tokens and stop reasons, logprobs within 1e-5 (float32 on CPU)."""
    assert len(got) == len(want)
    for gs, ws in zip(got, want):
        assert len(gs) == len(ws)
        for g, w in zip(gs, ws):
            assert g.token_ids == w.token_ids and g.stop_reason == w.stop_reason
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)


def run(coro):
    return asyncio.run(coro)


__all__ = ["PROMPTS", "TOK", "encode", "peaky_model", "tiny_llama", "tiny_qwen2", "engine", "eager", "assert_same",
           "run"]
