"""The Triton kernels against the torch ops they replace (float32); skipped where triton is not installed.

Without a GPU they run under Triton's interpreter, which must be switched on (TRITON_INTERPRET=1) before triton is
first imported — and torch may have imported it already — so there this file re-runs itself in a fresh process.
"""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from forge_exp.generators import ops, triton_ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HERE = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
kernel_test = pytest.mark.skipif(not HERE, reason="runs in the process test_under_the_interpreter starts")


@pytest.mark.slow
@pytest.mark.skipif(HERE, reason="this process already runs the kernels")
def test_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture
def g():
    return torch.Generator(device=DEVICE).manual_seed(0)


def randn(g, *shape):
    return torch.randn(*shape, generator=g, device=DEVICE)


@kernel_test
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(g, with_residual):
    x, r, w = randn(g, 5, 96), randn(g, 5, 96), randn(g, 96)
    res = r if with_residual else None
    (y, h), (y0, h0) = triton_ops.add_rms_norm(x, res, w, 1e-6), ops.add_rms_norm(x, res, w, 1e-6)
    assert rel(y, y0) < 1e-6 and torch.equal(h, h0)


@kernel_test
@pytest.mark.parametrize("qk_norm", [False, True])
def test_qk_rope_store_writes_the_cache_where_the_torch_op_does(g, qk_norm):
    n, hq, hkv, d, slots, length = 6, 4, 2, 32, 3, 40
    qkv, norm = randn(g, n, (hq + 2 * hkv) * d), randn(g, 2 * d) if qk_norm else None
    cos, sin = randn(g, n, d), randn(g, n, d)
    positions = torch.tensor([0, 7, 39, 12, 7, 3], device=DEVICE)
    slot_ids = torch.tensor([0, 1, 2, 1, 3, 3], device=DEVICE)
    caches = [randn(g, slots + 1, hkv, length, d) for _ in range(2)]
    ours = [c.clone() for c in caches]
    q = triton_ops.qk_rope_store(qkv, norm, 1e-6, cos, sin, positions, slot_ids, *ours, hq)
    q0 = ops.qk_rope_store(qkv, norm, 1e-6, cos, sin, positions, slot_ids, *caches, hq)
    assert rel(q, q0) < 1e-6
    for c, c0 in zip(ours, caches):  # every written entry matches and nothing else moved
        assert (c - c0).abs().max() < 1e-5


@kernel_test
def test_attention_reads_each_rows_live_prefix(g):
    n, hq, hkv, d, slots, length = 5, 4, 2, 16, 3, 300  # 300 positions: three chunks of 128, the last partial
    q = randn(g, n, hq, d)
    k, v = randn(g, slots + 1, hkv, length, d), randn(g, slots + 1, hkv, length, d)
    slot_ids = torch.tensor([0, 1, 2, 1, 3], device=DEVICE)
    lengths = torch.tensor([1, 6, 300, 129, 128], device=DEVICE)
    want = ops.attention(q, k, v, slot_ids, lengths, None, d**-0.5)
    assert rel(triton_ops.attention(q, k, v, slot_ids, lengths, None, d**-0.5), want) < 1e-5
    assert rel(triton_ops.attention(q, k, v, slot_ids, lengths, 300, d**-0.5), want) < 1e-5
    k[0, :, 1:] = float("nan")  # past row 0's length: never read
    assert torch.isfinite(triton_ops.attention(q, k, v, slot_ids, lengths, None, d**-0.5)[0]).all()


@kernel_test
def test_attention_reads_a_shared_prefix_from_its_slot(g):
    """Rows whose prompt K/V sit in another slot (positions below their prefix length) read what copies of them
    in their own slots would give."""
    n, hq, hkv, d, slots, length = 5, 4, 2, 16, 4, 300
    q = randn(g, n, hq, d)
    k, v = randn(g, slots + 1, hkv, length, d), randn(g, slots + 1, hkv, length, d)
    slot_ids = torch.tensor([0, 1, 2, 3, 4], device=DEVICE)
    lengths = torch.tensor([140, 3, 300, 200, 129], device=DEVICE)
    prefix = (torch.tensor([0, 0, 0, 3, 2], device=DEVICE), torch.tensor([0, 2, 130, 200, 129], device=DEVICE))
    copied_k, copied_v = k.clone(), v.clone()
    for row, (src, upto) in enumerate(zip(*prefix)):
        copied_k[row, :, :upto], copied_v[row, :, :upto] = k[src, :, :upto], v[src, :, :upto]
    want = ops.attention(q, copied_k, copied_v, slot_ids, lengths, None, d**-0.5)
    assert rel(ops.attention(q, k, v, slot_ids, lengths, None, d**-0.5, prefix), want) < 1e-6
    assert rel(triton_ops.attention(q, k, v, slot_ids, lengths, None, d**-0.5, prefix), want) < 1e-5
    k[1, :, :2] = float("nan")  # row 1's prompt is read from slot 0, not from its own slot
    assert torch.isfinite(triton_ops.attention(q, k, v, slot_ids, lengths, None, d**-0.5, prefix)[1]).all()


@kernel_test
def test_the_engine_keeps_a_shared_prompt_until_its_last_sample_is_done(monkeypatch):
    """The engine on these kernels with share_prompt_kv: the samples of a prompt read its K/V from the first
    sample's slot. Rows stop at an EOS at different steps and 18 rows go through 5 slots, so slots are taken again
    while samples of other prompts still read theirs: the tokens and logprobs are still the eager path's, and every
    slot is free at the end. With the knob off the engine copies, with the same result."""
    from forge_exp.generators import native
    from forge_exp.generators.base import Sampling
    from tests.generators.helpers import PROMPTS, TOK, assert_same, eager, encode, engine, peaky_model, run

    monkeypatch.setattr(native, "_kernels", lambda device: triton_ops)  # on CPU the engine would take the torch ops
    prompts = encode(PROMPTS)
    free = eager(peaky_model(seed=3).to(DEVICE), prompts, Sampling(n=3, max_new_tokens=12, seed=5), eos=-1)
    rows = [set(r.token_ids) for gs in free for r in gs]
    eos = min(range(4, len(TOK)), key=lambda t: abs(sum(t in r for r in rows) - len(rows) / 2))
    sampling = Sampling(n=3, max_new_tokens=12, seed=5)
    with engine(peaky_model(seed=3).to(DEVICE), slots=5, eos_token_ids=[eos], share_prompt_kv=True) as e:
        got = run(e.generate(prompts, sampling))
        shared = int((e.runner.plen > 0).sum())
        idle = e._slots.idle
    assert {r.stop_reason for gs in got for r in gs} == {"eos", "length"}
    assert_same(got, eager(peaky_model(seed=3).to(DEVICE), prompts, sampling, eos=eos))
    assert e.runner.shared and shared > 0  # the last rows admitted read a prompt from another slot
    assert idle  # every slot free again, held by no row
    with engine(peaky_model(seed=3).to(DEVICE), slots=5, eos_token_ids=[eos], share_prompt_kv=False) as e:  # copies
        assert_same(run(e.generate(prompts, sampling)), got)
        assert not e.runner.shared and not bool((e.runner.plen > 0).any())


@kernel_test
def test_silu_mul(g):
    gu = randn(g, 3, 2 * 1500)  # two blocks of 1024, the second partial
    assert rel(triton_ops.silu_mul(gu), ops.silu_mul(gu)) < 1e-6


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_draws_the_torch_samplers_tokens(g, dtype):
    from forge_exp.models.sampling import row_key

    b, v = 6, triton_ops.SAMPLE_BLOCK + 1000  # two blocks, the second partial
    logits = (randn(g, b, v) * 4).to(dtype)
    logits[1, 7:] = float("-inf")  # all the mass in the first columns: the draw must not land past them
    logits[4, v - 1] = 50.0  # the largest logit in the last, partial block
    temp = torch.tensor([1.0, 1.0, 0.0, 0.7, 0.0, 1.3], device=DEVICE)
    keys = torch.tensor([row_key(3, r) for r in range(b)], device=DEVICE)
    ones = torch.ones(b, device=DEVICE)
    for step in range(4):
        steps = torch.full((b,), step, device=DEVICE)
        tok, lp = triton_ops.sample(logits, temp, ones, keys, steps, False)
        tok0, lp0 = ops.sample(logits, temp, ones, keys, steps, False)
        assert torch.equal(tok, tok0)
        assert (lp - lp0).abs().max() < 1e-5
    assert tok[1] < 7 and tok[4] == v - 1 and tok[2] == logits[2].float().argmax()
