"""The Triton kernels against the torch ops they replace (float32). On a machine without a GPU they run under
Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported); skipped where triton is not installed."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from forge_exp.generators import ops, triton_ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture
def g():
    return torch.Generator(device=DEVICE).manual_seed(0)


def randn(g, *shape):
    return torch.randn(*shape, generator=g, device=DEVICE)


@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(g, with_residual):
    x, r, w = randn(g, 5, 96), randn(g, 5, 96), randn(g, 96)
    res = r if with_residual else None
    (y, h), (y0, h0) = triton_ops.add_rms_norm(x, res, w, 1e-6), ops.add_rms_norm(x, res, w, 1e-6)
    assert rel(y, y0) < 1e-6 and torch.equal(h, h0)


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


def test_silu_mul(g):
    gu = randn(g, 3, 2 * 1500)  # two blocks of 1024, the second partial
    assert rel(triton_ops.silu_mul(gu), ops.silu_mul(gu)) < 1e-6
