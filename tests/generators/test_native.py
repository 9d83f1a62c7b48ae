"""The native engine against the eager reference (float32, CPU): same tokens, same logprobs, whatever the schedule."""

import asyncio
from dataclasses import replace

import pytest
import torch

from forge_exp.generators.base import Engine, Sampling
from tests.generators.helpers import (PROMPTS, TOK, assert_same, eager, encode, engine, peaky_model, run,
                                      tiny_llama, tiny_qwen2)

ARCHS = {"qwen3": peaky_model, "llama": tiny_llama, "qwen2": tiny_qwen2}
# lookahead: the next chunk queued before the last is read back (on by default on GPU; here chunks of 3 steps)
LOOKAHEAD = pytest.mark.parametrize("knobs", [{}, {"lookahead": True, "sync_every": 3}], ids=["plain", "lookahead"])


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_matches_the_eager_path(arch, temperature, top_p):
    model, reference = ARCHS[arch](), ARCHS[arch]()
    sampling = Sampling(n=3, temperature=temperature, top_p=top_p, max_new_tokens=10, seed=11)
    prompts = encode(PROMPTS)
    with engine(model, slots=8) as e:
        assert isinstance(e, Engine) and e.plain_reason is None
        got = run(e.generate(prompts, sampling))
        # 18 rows through 8 slots; the samples of a prompt admitted together share one prefill
        assert sum(map(len, prompts)) <= e.runner.prefill_tokens < 3 * sum(map(len, prompts))
    want = eager(reference, prompts, sampling)
    assert_same(got, want)
    assert len({tuple(g.token_ids) for gs in got for g in gs}) > 3  # the rows really differ


def test_qwen2_biases_go_through_the_fused_projection():
    s = Sampling(n=2, max_new_tokens=10, seed=5)
    with engine(tiny_qwen2()) as e:
        got = run(e.generate(encode(PROMPTS), s))
    assert_same(got, eager(tiny_qwen2(), encode(PROMPTS), s))


def test_greedy_takes_the_argmax_and_its_logprob():
    model = peaky_model()
    with engine(model) as e:
        got = run(e.generate(encode(PROMPTS), Sampling(n=2, temperature=0.0, max_new_tokens=6)))
    for a, b in got:  # greedy: both samples of a prompt agree, whatever their keys
        assert a.token_ids == b.token_ids
    assert_same(got, eager(peaky_model(), encode(PROMPTS), Sampling(n=2, temperature=0.0, max_new_tokens=6, seed=0)))


def test_tiny_top_p_keeps_only_the_most_likely_token():
    model = peaky_model()
    with engine(model) as e:
        nucleus = run(e.generate(encode(PROMPTS), Sampling(n=2, top_p=1e-4, max_new_tokens=6, seed=3)))
        greedy = run(e.generate(encode(PROMPTS), Sampling(n=2, temperature=0.0, max_new_tokens=6)))
    for ns, gs in zip(nucleus, greedy):
        for n, g in zip(ns, gs):
            assert n.token_ids == g.token_ids  # one token survives the nucleus: the argmax
            # behaviour logprobs stay those of the full distribution (T = 1 here), not of the truncated one
            assert torch.allclose(torch.tensor(n.logprobs), torch.tensor(g.logprobs), atol=1e-5)


@LOOKAHEAD
def test_continuous_batching_reuses_slots_and_keeps_every_row_exact(knobs):
    """Two slots, requests of different lengths submitted at once: short ones finish and free their slot for the
    next waiting row while long ones keep decoding; every row still equals its own eager reference."""
    model, reference = peaky_model(), peaky_model()
    prompts = encode(PROMPTS)
    samplings = [Sampling(n=2, max_new_tokens=m, seed=s) for s, m in [(1, 3), (2, 20), (3, 7), (4, 1)]]

    async def main(e):
        return await asyncio.gather(*(e.generate(prompts[i : i + 2], s) for i, s in enumerate(samplings)))

    with engine(model, slots=2, **knobs) as e:
        results = run(main(e))
        stats = dict(e.stats)
    for i, (got, s) in enumerate(zip(results, samplings)):
        assert_same(got, eager(reference, prompts[i : i + 2], s))
        assert all(len(g.token_ids) <= s.max_new_tokens for gs in got for g in gs)
    assert stats["admitted"] == 16 and stats["prefills"] >= 8  # 16 rows through 2 slots


@LOOKAHEAD
def test_rows_stop_at_eos_and_the_slot_moves_on(knobs):
    model = peaky_model(seed=3)
    prompts = encode(PROMPTS * 2)
    free = eager(peaky_model(seed=3), prompts, Sampling(max_new_tokens=12, seed=5), eos=-1)
    # the token found in about half of the free runs: those rows stop there, the others run to the limit
    rows = [set(g[0].token_ids) for g in free]
    eos = min(range(4, len(TOK)), key=lambda t: abs(sum(t in r for r in rows) - len(rows) / 2))
    sampling = Sampling(max_new_tokens=12, seed=5)
    with engine(model, slots=3, eos_token_ids=[eos], **knobs) as e:
        got = run(e.generate(prompts, sampling))
        assert (e.stats["ahead"] > 0) == bool(knobs)
    assert {g[0].stop_reason for g in got} == {"eos", "length"}
    assert_same(got, eager(peaky_model(seed=3), prompts, sampling, eos=eos))
    for g, f in zip(got, free):
        if g[0].stop_reason == "eos":  # the free run cut at its first `eos`
            assert g[0].token_ids == f[0].token_ids[: f[0].token_ids.index(eos) + 1]


@pytest.mark.parametrize("lookahead", [False, True])
def test_concurrent_calls_are_batched_together_and_each_is_exact(lookahead):
    model = peaky_model()
    prompts = encode(PROMPTS)
    calls = [Sampling(n=2, temperature=1.0, max_new_tokens=9, seed=21),
             Sampling(n=1, temperature=0.0, max_new_tokens=5),
             Sampling(n=3, temperature=0.8, top_p=0.7, max_new_tokens=12, seed=22)]

    async def main(e):
        return await asyncio.gather(*(e.generate(prompts, s) for s in calls))

    with engine(model, slots=32, sync_every=4, lookahead=lookahead) as e:
        results = run(main(e))
        assert e.stats["prefills"] < 3  # calls that arrive together share prefills (and then decode steps)
        assert (e.stats["ahead"] > 0) == lookahead
    for got, s in zip(results, calls):  # greedy ignores the seed: any will do for the reference
        assert_same(got, eager(peaky_model(), prompts, s if s.seed is not None else replace(s, seed=0)))


@pytest.mark.parametrize("gather_ms", [0, 2000])
def test_an_idle_engine_gathers_the_calls_made_together_before_its_prefill(gather_ms):
    """A second call 0.2 s after the first: within gather_ms, both are prefilled (and decoded) as one batch; without
    a window the first call starts alone and the second is prefilled on its own."""
    prompts = encode(PROMPTS)
    calls = [Sampling(n=2, max_new_tokens=6, seed=31), Sampling(n=2, max_new_tokens=6, seed=32)]

    async def main(e):
        first = asyncio.ensure_future(e.generate(prompts, calls[0]))
        await asyncio.sleep(0.2)
        return await asyncio.gather(first, e.generate(prompts, calls[1]))

    with engine(peaky_model(), slots=32, gather_ms=gather_ms) as e:
        results = run(main(e))
        assert e.stats["prefills"] == (1 if gather_ms else 2)
    for got, s in zip(results, calls):
        assert_same(got, eager(peaky_model(), prompts, s))


def test_a_call_without_seed_takes_the_next_one_from_the_engine():
    model = peaky_model()
    s = Sampling(n=2, max_new_tokens=6)
    with engine(model) as e:
        first, second = run(e.generate(encode(PROMPTS), s)), run(e.generate(encode(PROMPTS), s))
    with engine(peaky_model()) as e:
        again = run(e.generate(encode(PROMPTS), s))
    assert_same(again, first)  # reproducible from the engine seed
    assert [g.token_ids for gs in first for g in gs] != [g.token_ids for gs in second for g in gs]


def test_load_weights_between_calls_gives_the_new_models_outputs():
    old, new = peaky_model(seed=0), peaky_model(seed=1)
    prompts, s = encode(PROMPTS), Sampling(n=2, max_new_tokens=8, seed=9)
    with engine(peaky_model(seed=0)) as e:
        before = run(e.generate(prompts, s))
        e.load_weights(new.state_dict().items())
        after = run(e.generate(prompts, s))
    assert_same(before, eager(old, prompts, s))
    assert_same(after, eager(new, prompts, s))


@pytest.mark.slow
@LOOKAHEAD
def test_load_weights_mid_flight_changes_the_rest_of_a_running_row(knobs):
    prompts, s = encode(PROMPTS[:2]), Sampling(n=2, max_new_tokens=120, seed=4)
    baseline = eager(_long(0), prompts, s)
    new = _long(1)

    async def main(e):
        task = asyncio.ensure_future(e.generate(prompts, s))
        while e.stats["decode_steps"] < 5:  # let the rows get going under the old weights
            await asyncio.sleep(0.001)
        await asyncio.to_thread(e.load_weights, new.state_dict().items())
        steps_at_load = e.stats["decode_steps"]
        return await task, steps_at_load

    with engine(_long(0), max_len=128, eos_token_ids=[], **knobs) as e:
        got, steps_at_load = run(main(e))
    assert steps_at_load < 119  # the load landed while the rows were still running
    for gs, bs in zip(got, baseline):
        for g, b in zip(gs, bs):
            assert len(g.token_ids) == 120
            assert g.token_ids[:5] == b.token_ids[:5]  # drawn before the load
            assert g.token_ids != b.token_ids  # the new weights took over mid-row


def _long(seed):
    from forge_exp.models.tiny import qwen3
    from tests.generators.helpers import peaky

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peaky(qwen3(vocab_size=len(TOK), hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                           head_dim=16, intermediate_size=128, max_position_embeddings=128, pad_id=0, bos_id=2,
                           eos_id=1, seed=seed))


def test_errors_name_the_knob_or_the_field():
    with pytest.raises(ValueError, match="generator.slotz is not a knob"):
        engine(peaky_model(), slotz=4)
    # (a knob's range is the schema's: tests/config/test_errors.py)
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1.0)
    with engine(peaky_model(), max_len=16) as e:
        with pytest.raises(ValueError, match="generator.max_len=16"):
            run(e.generate([[2] * 10], Sampling(max_new_tokens=8)))
        with pytest.raises(ValueError, match="at least one token"):
            run(e.generate([[2, 5], []], Sampling(max_new_tokens=4)))
        with pytest.raises(KeyError, match="no parameter named"):
            e.load_weights([("model.nope.weight", torch.zeros(1))])
        assert run(e.generate([], Sampling())) == []
    with pytest.raises(RuntimeError, match="closed"):
        run(e.generate([[2, 5]], Sampling()))


def test_other_architectures_take_the_plain_path():
    from transformers import GPT2Config, GPT2LMHeadModel

    def gpt2():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                          bos_token_id=2, eos_token_id=1, pad_token_id=0)).eval()

    s = Sampling(n=2, max_new_tokens=6, seed=3)
    with engine(gpt2()) as e:
        assert "gpt2" in e.plain_reason
        got = run(e.generate(encode(PROMPTS), s))
    assert_same(got, eager(gpt2(), encode(PROMPTS), s))


def test_built_from_the_model_config():
    from forge_exp.models.tiny import TinyQwen3
    from forge_exp.generators.native import NativeEngine

    s = Sampling(n=4, max_new_tokens=8, seed=2)
    prompts = encode(["1+2=", "37+48="])
    with NativeEngine(TinyQwen3(), "cpu", 0, slots=4) as e:
        assert e.tokenizer.eos_token_id == TOK.eos_token_id and e.max_len == 64
        got = run(e.generate(prompts, s))
    assert_same(got, eager(TinyQwen3().build(), prompts, s))


def test_a_failure_in_the_worker_reaches_every_caller():
    with engine(peaky_model()) as e:
        bad = [[2, len(TOK) + 5]]  # a token id past the vocabulary: the embedding lookup fails on the worker

        async def main():
            return await asyncio.gather(e.generate(bad, Sampling(max_new_tokens=4)),
                                        e.generate(encode(PROMPTS), Sampling(max_new_tokens=4)),
                                        return_exceptions=True)

        outcomes = run(main())
        assert all(isinstance(o, IndexError) for o in outcomes)  # both calls hear of it; neither hangs
        with pytest.raises(RuntimeError, match="engine failed"):
            run(e.generate(encode(PROMPTS), Sampling(max_new_tokens=4)))
