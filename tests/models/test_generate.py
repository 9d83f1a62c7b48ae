"""The KV-cache generator against a full recompute, per-row stopping, left padding, and its speed."""

import time

import pytest
import torch

from forge_exp.models.sampling import row_key, sample
from forge_exp.models.generate import generate, left_pad, positions_from_mask
from tests.models.helpers import PROMPTS, TOK, encode, peaky_model


def sample_scalar(logits, temperature, top_p, seed, step):
    """The shared sampler with one temperature / top_p for every row; row r is keyed (seed, r)."""
    b = logits.shape[0]
    keys = torch.tensor([row_key(seed, r) for r in range(b)])
    return sample(logits, torch.full((b,), temperature), torch.full((b,), top_p), keys,
                  torch.full((b,), step), truncate=top_p < 1)


@torch.no_grad()
def generate_without_cache(model, prompt_ids, *, max_new_tokens, temperature, top_p, eos_id, pad_id, seed):
    """Reference: recompute the whole left-padded sequence for every new token; same sampling, same stopping."""
    ids, mask = left_pad(prompt_ids, pad_id)
    done = torch.zeros(len(prompt_ids), dtype=torch.bool)
    rows = [([], [], "length") for _ in prompt_ids]
    for step in range(max_new_tokens):
        positions = positions_from_mask(mask)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        tok, lp = sample_scalar(logits[:, -1].float(), temperature, top_p, seed, step)
        tok = tok.masked_fill(done, pad_id)
        for i in range(len(rows)):
            if not done[i]:
                rows[i][0].append(int(tok[i]))
                rows[i][1].append(float(lp[i]))
                if tok[i] == eos_id:
                    rows[i] = (rows[i][0], rows[i][1], "eos")
        done |= tok == eos_id
        if done.all():
            break
        ids = torch.cat([ids, tok[:, None]], 1)
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.bool)], 1)
    return rows


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_kv_cache_matches_full_recompute(temperature, top_p):
    model = peaky_model()
    prompts = encode(PROMPTS)
    kw = dict(max_new_tokens=10, temperature=temperature, top_p=top_p, eos_id=TOK.eos_token_id, pad_id=0)
    fast = generate(model, prompts, seed=7, **kw)
    slow = generate_without_cache(model, prompts, seed=7, **kw)
    assert len({tuple(g.token_ids) for g in fast}) > 1  # the rows really differ
    for g, (tokens, logprobs, reason) in zip(fast, slow):
        assert g.token_ids == tokens and g.stop_reason == reason
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(logprobs), atol=1e-5, rtol=0)


def test_prefill_once_then_one_token_per_step():
    model = peaky_model()
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    prompts = encode(PROMPTS)
    out = generate(model, prompts, max_new_tokens=6, temperature=1.0, eos_id=-1, pad_id=0,
                   generator=torch.Generator().manual_seed(0))
    hook.remove()
    width = max(len(p) for p in prompts)
    assert seen == [(len(prompts), width)] + [(len(prompts), 1)] * 5
    assert all(len(g.token_ids) == 6 and g.stop_reason == "length" for g in out)


def test_rows_stop_independently_at_eos():
    model = peaky_model(seed=3)
    prompts = encode(PROMPTS * 4)
    kw = dict(max_new_tokens=12, temperature=1.0, top_p=1.0, pad_id=0)
    free = generate(model, prompts, eos_id=-1, generator=torch.Generator().manual_seed(1), **kw)
    # Call the token sampled most often at step 3 "EOS": some rows then stop early, others run to the limit.
    third = [g.token_ids[2] for g in free]
    eos = max(set(third), key=third.count)
    out = generate(model, prompts, eos_id=eos, generator=torch.Generator().manual_seed(1), **kw)
    reasons = {g.stop_reason for g in out}
    assert reasons == {"eos", "length"}
    for g, f in zip(out, free):
        if g.stop_reason == "eos":
            assert g.token_ids[-1] == eos and eos not in g.token_ids[:-1]
            # same draws until the stop: the row's output is the free run cut at its first `eos`
            assert g.token_ids == f.token_ids[: f.token_ids.index(eos) + 1]
        else:
            assert len(g.token_ids) == 12 and eos not in g.token_ids
        assert len(g.logprobs) == len(g.token_ids)


def test_left_padding_does_not_change_a_row():
    model = peaky_model()
    prompts = encode(PROMPTS)
    batch = generate(model, prompts, max_new_tokens=8, temperature=0.0, eos_id=TOK.eos_token_id, pad_id=0)
    for p, g in zip(prompts, batch):
        alone = generate(model, [p], max_new_tokens=8, temperature=0.0, eos_id=TOK.eos_token_id, pad_id=0)[0]
        assert alone.token_ids == g.token_ids
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(g.logprobs), atol=1e-5, rtol=0)


def test_greedy_logprob_is_the_max_and_top_p_keeps_the_top_token():
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5], [0.0, 3.0, 2.9, -5.0]])
    tokens, logprobs = sample_scalar(logits, 0.0, 1.0, seed=0, step=0)
    assert tokens.tolist() == [0, 1]
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).max(-1).values)
    for step in range(20):  # top_p tiny: only the most likely token survives
        tokens, logprobs = sample_scalar(logits, 1.0, 1e-3, seed=0, step=step)
        assert tokens.tolist() == [0, 1]
    # behaviour logprob is of the temperature-scaled full distribution, not the top-p-renormalised one
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).max(-1).values)


def test_argument_errors():
    model = peaky_model()
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[2, 5]], max_new_tokens=0, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [[2, 5]], max_new_tokens=2, top_p=0.0, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[2, 5], []], max_new_tokens=2, eos_id=1, pad_id=0)
    assert generate(model, [], max_new_tokens=2, eos_id=1, pad_id=0) == []
