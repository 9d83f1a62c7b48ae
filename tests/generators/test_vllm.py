"""The vLLM generator backend, run for real on vLLM's CPU build (in .venv-vllm: `bash launchers/setup.sh --vllm`).

Every claim is checked against an independent float32 HF recompute of the same tokens with the same weights:
behaviour logprobs (the trainer's `log_softmax(logits / T)`), greedy tokens, and which weights produced which tokens
across an in-flight update.

The test model is the tiny Qwen3 with larger random weights (std 0.3, logits of std ~3): distinct prompts then give
distinct greedy continuations, and greedy choices are rarely near-ties. Its <eos> embedding row is zero, so its
<eos> logit is 0 among logits of std 3: greedy runs go to max_new_tokens, long enough to still be in flight when new
weights arrive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time

import pytest

if os.environ.get("FORGE_EXP_REQUIRE_VLLM") == "1":  # .ci/run in .venv-vllm: a broken install fails, never skips
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here: these run in .venv-vllm (launchers/setup.sh --vllm)")

import torch  # noqa: E402

from forge_exp.models.tiny import TinyQwen3  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.vllm import VersionSpan, VllmEngine  # noqa: E402

MAX_LEN = 512
KNOBS = dict(kv_cache_gib=0.25, max_model_len=MAX_LEN)
TEXTS = ["1+2=", "34*5=", "9-8=", "77/7=", "6*6=", "123+4=", "50-25=", "8/2="]


def sharp_model(seed: int):
    spec = TinyQwen3(max_position_embeddings=MAX_LEN, seed=seed)
    model, tokenizer = spec.build(), spec.tokenizer()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:  # embeddings and projections; the norms stay at 1
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        model.model.embed_tokens.weight[tokenizer.eos_token_id] = 0.0  # tied: the <eos> logit is 0
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def old():
    return sharp_model(0)


@pytest.fixture(scope="module")
def new():
    return sharp_model(1)[0]


@pytest.fixture(scope="module")
def engine(old, tmp_path_factory):
    model, tokenizer = old
    path = tmp_path_factory.mktemp("sharp")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    eng = VllmEngine(TinyQwen3(path=str(path), max_position_embeddings=MAX_LEN), "cpu", seed=0, **KNOBS)
    # the first step of a new engine is slow (lazy set-up in the workers): take it here, so that the in-flight tests'
    # requests are sampling when the weights change
    run(eng.generate(prompts(tokenizer, 1), Sampling(max_new_tokens=2)))
    yield eng
    eng.close()


@pytest.fixture
def restore(engine, old):
    """Tests that load other weights put the fixture's weights back."""
    yield
    engine.load_weights(old[0].state_dict().items())


def prompts(tokenizer, k=len(TEXTS)):
    return [tokenizer.encode(t) for t in TEXTS[:k]]


@torch.no_grad()
def logits_of(model, prompt, tokens, temperature=0.0):
    """Logits [len(tokens), V] that predicted each token, float32, teacher-forced, divided by T (T = 0 → 1)."""
    logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return logits / temperature if temperature > 0 else logits


def check(model, prompt, tokens, logprobs, temperature, lo=0, hi=None, greedy=False, tol=1e-4):
    """Against `model`'s recompute, tokens[lo:hi]: behaviour logprobs give the on-policy ratio 1 +- tol (the trainer
    recomputes log_softmax(logits / T)); with `greedy`, each token is the argmax (ties within 1e-4 accepted).
    Returns the unscaled logprobs of those tokens, to tell temperature-scaled logprobs from vLLM's default."""
    logits = logits_of(model, prompt, tokens, temperature)[lo:hi]
    chosen = torch.tensor(tokens[lo:hi])[:, None]
    want = torch.log_softmax(logits, -1).gather(-1, chosen).squeeze(-1)
    ratio = torch.exp(torch.tensor(logprobs[lo:hi]) - want)
    assert (ratio - 1).abs().max().item() < tol, (logprobs[lo:hi], want.tolist())
    if greedy:
        assert (logits.gather(-1, chosen).squeeze(-1) >= logits.max(-1).values - 1e-4).all(), (lo, tokens)
    unscaled = logits * temperature if temperature > 0 else logits
    return torch.log_softmax(unscaled, -1).gather(-1, chosen).squeeze(-1)


def run(coro):
    return asyncio.run(coro)


def test_tensor_parallel_2_on_cpu():
    """Two CPU workers, one core each (the engine splits this process's cores between them): the tiny default model,
    written to a temporary directory by the engine, samples with the recompute's logprobs, stops on <eos> (included
    in the tokens), and a weight update reaches both shards. First in the file: its engine is gone before the shared
    one starts."""
    hf, tokenizer = TinyQwen3().build(), TinyQwen3().tokenizer()
    other = TinyQwen3(seed=1).build()
    ps = [tokenizer.encode(t) for t in TEXTS[:4]]
    with VllmEngine(TinyQwen3(), "cpu", seed=0, tensor_parallel_size=2, kv_cache_gib=0.25) as eng:
        out = run(eng.generate(ps, Sampling(n=4, temperature=0.8, max_new_tokens=40)))
        stops = set()
        for prompt, row in zip(ps, out):
            for g in row:
                check(hf, prompt, g.token_ids, g.logprobs, 0.8)
                assert (g.stop_reason == "eos") == (g.token_ids[-1] == tokenizer.eos_token_id)
                stops.add(g.stop_reason)
        assert stops == {"eos", "length"}  # the untrained tiny model stops on <eos> now and then
        eng.load_weights(other.state_dict().items())
        out = run(eng.generate(ps, Sampling(n=2, temperature=1.0, max_new_tokens=20)))
        for prompt, row in zip(ps, out):
            for g in row:
                check(other, prompt, g.token_ids, g.logprobs, 1.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_behaviour_logprobs_equal_the_float32_recompute(engine, old, temperature):
    model, tokenizer = old
    n = 1 if temperature == 0 else 2
    ps = prompts(tokenizer, 4)
    out = run(engine.generate(ps, Sampling(n=n, temperature=temperature, max_new_tokens=24)))
    for prompt, row in zip(ps, out):
        for g in row:
            assert len(g.logprobs) == len(g.token_ids) and (g.stop_reason == "eos" or len(g.token_ids) == 24)
            unscaled = check(model, prompt, g.token_ids, g.logprobs, temperature, greedy=temperature == 0)
            if temperature not in (0.0, 1.0):
                # vLLM's default mode returns these pre-temperature logprobs: the check above tells the modes apart
                assert (torch.tensor(g.logprobs) - unscaled).abs().max() > 1e-2


def test_n_samples_per_prompt(engine, old):
    tokenizer = old[1]
    ps = prompts(tokenizer, 3)
    out = run(engine.generate(ps, Sampling(n=5, temperature=1.0, max_new_tokens=30)))
    assert [len(row) for row in out] == [5, 5, 5]
    seqs = [tuple(g.token_ids) for row in out for g in row]
    assert len(set(seqs)) == len(seqs)  # 15 distinct samples: no two requests share random noise
    for g in (g for row in out for g in row):
        assert len(g.token_ids) == len(g.logprobs) <= 30
        assert (g.stop_reason == "eos") == (g.token_ids[-1] == tokenizer.eos_token_id)
        assert g.stop_reason == "eos" or len(g.token_ids) == 30
    greedy = run(engine.generate(ps, Sampling(n=3, temperature=0.0, max_new_tokens=10)))
    assert all(len(row) == 3 and row[0] == row[1] == row[2] for row in greedy)


def test_concurrent_calls_share_the_engine_and_get_their_own_results(engine, old):
    """Calls from one event loop and from other threads are in the engine together; each gets its own prompts'."""
    model, tokenizer = old
    ps = prompts(tokenizer)
    greedy = Sampling(n=1, temperature=0.0, max_new_tokens=200)
    results: dict[int, list] = {}
    peak = [0]

    async def many(indices):
        outs = await asyncio.gather(*(engine.generate([ps[i]], greedy) for i in indices))
        results.update({i: o[0][0] for i, o in zip(indices, outs)})

    def watch(stop):
        while not stop.is_set():
            peak[0] = max(peak[0], engine.in_flight())
            time.sleep(0.005)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,))
    watcher.start()
    threads = [threading.Thread(target=run, args=(many(chunk),)) for chunk in ([0, 1, 2, 3], [4, 5], [6, 7])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert sorted(results) == list(range(len(ps)))
    assert peak[0] >= 2, "the calls never overlapped in the engine"
    for i, g in results.items():
        assert len(g.token_ids) == 200
        check(model, ps[i], g.token_ids, g.logprobs, 0.0, greedy=True)
    assert len({tuple(g.token_ids) for g in results.values()}) == len(ps)


def tokens_so_far(engine) -> int:
    """The fewest tokens any request in the engine has sampled yet (vLLM's own bookkeeping; 0 when none runs)."""
    while True:
        try:
            states = list(engine._engine.output_processor.request_states.values())
            return min((s.detokenizer.num_output_tokens() for s in states), default=0)
        except RuntimeError:  # the engine thread changed the dict while we read it
            continue


def in_background(engine, ps, sampling, tokens=8):
    """Start `generate_versioned` in a thread; return (thread, box) once every request has sampled `tokens` tokens."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(out=run(engine.generate_versioned(ps, sampling))))
    thread.start()
    deadline = time.monotonic() + 120
    while tokens_so_far(engine) < tokens and time.monotonic() < deadline:
        time.sleep(0.002)
    assert engine.in_flight() > 0, "the requests finished before the test could update the weights"
    return thread, box


def test_weight_update_mid_flight_switches_to_the_new_weights(engine, old, new, restore):
    model, tokenizer = old
    ps = prompts(tokenizer)
    thread, box = in_background(engine, ps, Sampling(n=1, temperature=0.0, max_new_tokens=450))
    assert engine.load_weights(new.state_dict().items(), version=7) == 7
    thread.join()
    assert engine.version == 7
    switched = 0
    for prompt, (v,) in zip(ps, box["out"]):
        tokens, lps = v.generation.token_ids, v.generation.logprobs
        assert len(tokens) == 450
        assert v.spans[0].start == 0 and v.spans[-1].end == 450
        for span in v.spans:
            # before the swap the old weights' choices, after it the new weights' given the same prefix
            weights = {0: model, 7: new}[span.version]
            check(weights, prompt, tokens, lps, 0.0, span.start, span.end, greedy=True)
        switched += [s.version for s in v.spans] == [0, 7]
        assert v.oldest_version == v.spans[0].version
    assert switched == len(ps), "a request was not in flight across the update"
    after = run(engine.generate_versioned(ps, Sampling(n=1, temperature=0.0, max_new_tokens=40)))
    for prompt, (v,) in zip(ps, after):
        assert [s.version for s in v.spans] == [7]
        check(new, prompt, v.generation.token_ids, v.generation.logprobs, 0.0, greedy=True)
    assert any(v.generation.token_ids != b.generation.token_ids[:40] for (v,), (b,) in zip(after, box["out"]))


def test_without_the_0_32_api_a_completion_carries_the_version_it_was_sent_under(engine, old, new, restore):
    """vLLM 0.26 has no per-token version spans and no version label (docs/generators.md): with
    those features off, the same engine stamps a completion that straddles an update with the older version, and
    its tokens are still those of each version's weights."""
    model, tokenizer = old
    ps = prompts(tokenizer)
    full = engine.features
    engine.features = full._replace(weight_versions=False)
    before = engine.version  # (earlier tests' updates moved it on)
    try:
        thread, box = in_background(engine, ps, Sampling(n=1, temperature=0.0, max_new_tokens=450))
        assert engine._engine.output_processor.get_num_unfinished_requests() == engine.in_flight() > 0
        assert engine.load_weights(new.state_dict().items(), version=before + 3) == before + 3
        thread.join()
        for prompt, (v,) in zip(ps, box["out"]):
            assert v.spans == (VersionSpan(before, 0, 450),)  # the older version, over every token
            check(model, prompt, v.generation.token_ids[:8], v.generation.logprobs[:8], 0.0, greedy=True)
        after = run(engine.generate_versioned(ps, Sampling(n=1, temperature=0.0, max_new_tokens=20)))
        for prompt, (v,) in zip(ps, after):
            assert v.spans == (VersionSpan(before + 3, 0, 20),)
            check(new, prompt, v.generation.token_ids, v.generation.logprobs, 0.0, greedy=True)
    finally:
        engine.features = full


def test_updates_with_requests_in_flight_lose_none(engine, old, restore):
    """Three updates (keep mode) while 8 prompts x 3 samples run: all 24 come back whole, versions in order; then
    wait mode: requests in flight finish on the old weights before the update applies."""
    model, tokenizer = old
    ps = prompts(tokenizer)
    sampling = Sampling(n=3, temperature=1.0, max_new_tokens=400)
    thread, box = in_background(engine, ps, sampling)
    start = engine.version
    for _ in range(3):
        engine.load_weights(model.state_dict().items())
        time.sleep(0.1)
    thread.join()
    out = box["out"]
    assert [len(row) for row in out] == [3] * len(ps)
    crossed = 0
    for v in (v for row in out for v in row):
        g = v.generation
        assert len(g.token_ids) == len(g.logprobs) and (g.stop_reason == "eos" or len(g.token_ids) == 400)
        assert v.spans[0].start == 0 and v.spans[-1].end == len(g.token_ids)
        assert all(a.end == b.start and a.version < b.version for a, b in zip(v.spans, v.spans[1:]))
        assert all(start <= s.version <= start + 3 for s in v.spans)
        crossed += len(v.spans) > 1
    assert crossed, "no request was in flight across an update"

    engine.options = dataclasses.replace(engine.options, inflight_update="wait")
    try:
        thread, box = in_background(engine, ps, Sampling(n=1, temperature=0.0, max_new_tokens=400))
        version = engine.load_weights(model.state_dict().items())
        thread.join()
    finally:
        engine.options = dataclasses.replace(engine.options, inflight_update="keep")
    for (v,) in box["out"]:
        assert len(v.spans) == 1 and v.spans[0].version == version - 1 and v.spans[0].end == 400


def test_refusals_name_the_key(engine):
    with pytest.raises(ValueError, match="algorithm.top_p"):
        run(engine.generate([[2, 5]], Sampling(top_p=0.9)))
    with pytest.raises(ValueError, match="generator.enable_sleep_mode"):
        VllmEngine(TinyQwen3(), "cpu", enable_sleep_mode=True, **KNOBS)
    with pytest.raises(ValueError, match="generator device 'cuda'"):
        VllmEngine(TinyQwen3(), "cuda", **KNOBS)
