"""Triton kernels for the decoder's fused steps: the same functions and signatures as `ops.py`, one launch each.

Why: a decode step at batch 32 is a few MB of activations against GBs of weights and KV cache, so the eager step's
~30 small kernels per layer cost more in launches than in bytes. Fused, a layer is two norms, one rotary/cache-write
kernel, split-KV attention (two launches) and four GEMMs. Attention reads only each row's live cache positions
(`lengths`), so a batch whose rows sit at different positions (continuous batching) costs what its rows hold.

The sampler (`sample`) is models/sampling.sample's untruncated inverse-CDF draw in one launch: three reads of
the logits in the model dtype instead of the torch ops' ~ten passes over a float32 copy. Its running mass adds in
a different order than torch's cumsum, so on a flat distribution over a large vocabulary (151,936 columns, float32:
~1e-5 of accumulated rounding against per-column masses of ~1e-7) a draw can land a few columns away from the torch
op's; each is the same distribution's draw to float32 precision. The CPU path is the torch op itself.

Loops have compile-time bounds and masked tails, which keeps the kernels capturable in CUDA graphs and runnable
under TRITON_INTERPRET=1 on a CPU for tests; the one data-dependent branch is attention's: a program whose chunk lies
past its row's length returns at once (a CUDA graph's grid covers the whole cache, sized for generator.max_len,
while the rows hold only what they have decoded so far), and the combine reads only the live chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forge_exp.models.sampling import sample as torch_sample
from forge_exp.models.sampling import uniform

# Attention splits the cache into chunks of SPLIT positions, one program each; chunks past a row's length do no
# loads. 128 positions x 256 B x (K, V) = 64 KB per program keeps thousands of programs in flight at batch 32.
SPLIT = 128
BLOCK_N = 64
ATTN_WARPS = 4
ATTN_STAGES = 2  # software pipelining depth of the chunk loop
SAMPLE_BLOCK = 8192  # vocabulary columns a sampling program reads at once
SAMPLE_WARPS = 16
# These launch settings are the fastest of benchmarks/generation.py --sweep on one H200 at batch 256 (attention
# at ~65% of the copy bandwidth, the sampler 0.29 ms against the torch ops' 0.94 ms over [256, 151936] logits).
PACKED_PREFILL = True  # prefill takes prompts packed, no padding: each token is a row of `attention`
SLOT_WINDOW = False  # attention indexes the cache by slot id itself
SHARED_PREFIX = True  # the samples of a prompt read its K/V from one slot (`attention`'s prefix), not copies


@triton.jit
def _add_rms_norm_kernel(X, R, W, Y, H, stride_x, stride_r, stride_y, stride_h, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(X + row * stride_x + offs, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * stride_r + offs, mask=m, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)  # the residual stream stays in the model dtype
        tl.store(H + row * stride_h + offs, x, mask=m)
    xf = x.to(tl.float32)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + offs, (w * normed).to(Y.dtype.element_ty), mask=m)


def add_rms_norm(x, residual, weight, eps):
    n, hidden = x.shape
    y = torch.empty_like(x)
    h = x if residual is None else torch.empty_like(x)
    r = x if residual is None else residual
    _add_rms_norm_kernel[(n,)](x, r, weight, y, h, x.stride(0), r.stride(0), y.stride(0), h.stride(0), eps,
                               N=hidden, BLOCK=triton.next_power_of_2(hidden), HAS_RES=residual is not None,
                               num_warps=8 if hidden >= 2048 else 4)
    return y, h


@triton.jit
def _qk_rope_store_kernel(QKV, QKW, COS, SIN, POS, SLOT, QOUT, KC, VC,
                          stride_qkv, stride_qo_n, stride_qo_h, stride_cos,
                          stride_cs, stride_cl, stride_ch, eps,
                          HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HAS_NORM: tl.constexpr):
    # One program per (row, head) over the q and k heads; a k head's program also moves its v head.
    n = tl.program_id(0)
    h = tl.program_id(1)
    is_k = h >= HQ
    is_q = h < HQ
    hk = tl.maximum(h - HQ, 0)
    half: tl.constexpr = D // 2
    o = tl.arange(0, half)
    pos = tl.load(POS + n)
    slot = tl.load(SLOT + n)
    base = QKV + n * stride_qkv + h * D
    x1 = tl.load(base + o)
    x2 = tl.load(base + half + o)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / D + eps)
        wbase = QKW + is_k.to(tl.int32) * D
        x1 = tl.load(wbase + o).to(tl.float32) * (x1 * inv).to(dtype).to(tl.float32)
        x2 = tl.load(wbase + half + o).to(tl.float32) * (x2 * inv).to(dtype).to(tl.float32)
        x1 = x1.to(dtype).to(tl.float32)
        x2 = x2.to(dtype).to(tl.float32)
    c1 = tl.load(COS + n * stride_cos + o).to(tl.float32)
    c2 = tl.load(COS + n * stride_cos + half + o).to(tl.float32)
    s1 = tl.load(SIN + n * stride_cos + o).to(tl.float32)
    s2 = tl.load(SIN + n * stride_cos + half + o).to(tl.float32)
    y1 = (x1 * c1 - x2 * s1).to(dtype)
    y2 = (x2 * c2 + x1 * s2).to(dtype)
    # lanes this program writes: all of them to q (a query head) or to the caches (a key head), none elsewhere;
    # spelled as one comparison, so the mask is a plain boolean block (Triton's interpreter takes no other kind)
    q_lanes = o < half * is_q.to(tl.int32)
    k_lanes = o < half * is_k.to(tl.int32)
    qo = QOUT + n * stride_qo_n + tl.minimum(h, HQ - 1) * stride_qo_h
    tl.store(qo + o, y1, mask=q_lanes)
    tl.store(qo + half + o, y2, mask=q_lanes)
    ko = KC + slot * stride_cs + pos * stride_cl + hk * stride_ch
    tl.store(ko + o, y1, mask=k_lanes)
    tl.store(ko + half + o, y2, mask=k_lanes)
    vi = QKV + n * stride_qkv + (HQ + HKV + hk) * D
    vo = VC + slot * stride_cs + pos * stride_cl + hk * stride_ch
    v1 = tl.load(vi + o, mask=k_lanes, other=0.0)
    v2 = tl.load(vi + half + o, mask=k_lanes, other=0.0)
    tl.store(vo + o, v1, mask=k_lanes)
    tl.store(vo + half + o, v2, mask=k_lanes)


def qk_rope_store(qkv, qk_norm, eps, cos, sin, positions, slots, k_cache, v_cache, num_heads):
    n = qkv.shape[0]
    kv_heads, d = k_cache.shape[1], k_cache.shape[3]
    assert k_cache.stride() == v_cache.stride() and qkv.stride(1) == 1 and cos.stride() == sin.stride()
    q = torch.empty((n, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    norm = qk_norm if qk_norm is not None else qkv  # unused pointer when HAS_NORM is False
    _qk_rope_store_kernel[(n, num_heads + kv_heads)](
        qkv, norm, cos, sin, positions, slots, q, k_cache, v_cache,
        qkv.stride(0), q.stride(0), q.stride(1), cos.stride(0),
        k_cache.stride(0), k_cache.stride(2), k_cache.stride(1), eps,
        HQ=num_heads, HKV=kv_heads, D=d, HAS_NORM=qk_norm is not None, num_warps=1)
    return q


@triton.jit
def _attn_split_kernel(Q, KC, VC, SLOT, LENS, PSLOT, PLEN, OP, LSE,
                       stride_qn, stride_qh, stride_cs, stride_cl, stride_ch,
                       stride_on, stride_oh, stride_os, stride_ln, stride_lh, scale,
                       G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr, BN: tl.constexpr,
                       CHUNK: tl.constexpr, IEEE: tl.constexpr, HAS_PREFIX: tl.constexpr):
    # Program (row, kv head, chunk): the G query heads of one kv head against one chunk of the row's cache. Rows
    # are the grid's fastest axis, so the rows that share a prefix read its blocks at about the same time (from L2).
    n = tl.program_id(0)
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    length = tl.load(LENS + n)
    if sp * CHUNK >= length:  # nothing of this row here: the combine reads only the chunks below its length
        return
    slot = tl.load(SLOT + n)
    if HAS_PREFIX:
        pslot = tl.load(PSLOT + n)
        plen = tl.load(PLEN + n)
    og = tl.arange(0, BG)
    od = tl.arange(0, D)
    gm = og < G
    heads = hk * G + og
    q = tl.load(Q + n * stride_qn + heads[:, None] * stride_qh + od[None, :], mask=gm[:, None], other=0.0)
    m_i = tl.full([BG], float("-inf"), tl.float32)
    l_i = tl.zeros([BG], tl.float32)
    acc = tl.zeros([BG, D], tl.float32)
    cache = slot * stride_cs + hk * stride_ch
    for i in range(CHUNK // BN):
        offs = sp * CHUNK + i * BN + tl.arange(0, BN)
        live = offs < length
        if HAS_PREFIX:  # positions below plen are the shared prompt's, in slot pslot
            at = (tl.where(offs < plen, pslot, slot) * stride_cs + hk * stride_ch + offs * stride_cl)[:, None]
        else:
            at = cache + offs[:, None] * stride_cl
        k = tl.load(KC + at + od[None, :], mask=live[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(live[None, :], s * scale, float("-inf"))  # [BG, BN]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-dead block must not make NaNs
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VC + at + od[None, :], mask=live[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(OP + n * stride_on + heads[:, None] * stride_oh + sp * stride_os + od[None, :], out, mask=gm[:, None])
    tl.store(LSE + n * stride_ln + heads * stride_lh + sp, lse, mask=gm)


@triton.jit
def _attn_combine_kernel(OP, LSE, LENS, OUT, stride_on, stride_oh, stride_os, stride_ln, stride_lh,
                         stride_outn, stride_outh, NS: tl.constexpr, BS: tl.constexpr, D: tl.constexpr,
                         CHUNK: tl.constexpr):
    n = tl.program_id(0)
    h = tl.program_id(1)
    os_ = tl.arange(0, BS)
    od = tl.arange(0, D)
    sm = (os_ < NS) & (os_ * CHUNK < tl.load(LENS + n))  # the chunks the split kernel wrote
    lse = tl.load(LSE + n * stride_ln + h * stride_lh + os_, mask=sm, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))  # chunk 0 always holds the current token, so the max is finite
    o = tl.load(OP + n * stride_on + h * stride_oh + os_[:, None] * stride_os + od[None, :], mask=sm[:, None],
                other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(OUT + n * stride_outn + h * stride_outh + od, out.to(OUT.dtype.element_ty))


def attention(q, k_cache, v_cache, slots, lengths, kv_len, scale, prefix=None):
    n, num_heads, d = q.shape
    kv_heads = k_cache.shape[1]
    group = num_heads // kv_heads
    # Chunks to launch: all of the cache unless the host bounds the lengths (eager prefill); a CUDA graph passes
    # None and so keeps one static grid, with dead chunks exiting after their masked loads.
    chunks = triton.cdiv(kv_len if kv_len is not None else k_cache.shape[2], SPLIT)
    partial = torch.empty((n, num_heads, chunks, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((n, num_heads, chunks), dtype=torch.float32, device=q.device)
    ieee = q.dtype == torch.float32
    pslots, plens = prefix if prefix is not None else (slots, lengths)  # unused pointers without a prefix
    _attn_split_kernel[(n, kv_heads, chunks)](
        q, k_cache, v_cache, slots, lengths, pslots, plens, partial, lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(2), k_cache.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1), scale,
        G=group, BG=max(16, triton.next_power_of_2(group)), D=d, BN=BLOCK_N, CHUNK=SPLIT, IEEE=ieee,
        HAS_PREFIX=prefix is not None, num_warps=ATTN_WARPS, **({} if ATTN_STAGES is None else {"num_stages": ATTN_STAGES}))
    out = torch.empty_like(q)
    _attn_combine_kernel[(n, num_heads)](
        partial, lse, lengths, out, partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0),
        lse.stride(1), out.stride(0), out.stride(1), NS=chunks, BS=max(2, triton.next_power_of_2(chunks)), D=d,
        CHUNK=SPLIT, num_warps=4)
    return out


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_gu, stride_o, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    g = tl.load(GU + row * stride_gu + offs, mask=m, other=0.0)
    u = tl.load(GU + row * stride_gu + I + offs, mask=m, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)  # silu rounds to the model dtype, as in HF
    tl.store(OUT + row * stride_o + offs, (act * u).to(g.dtype), mask=m)


def silu_mul(gate_up):
    n, two_i = gate_up.shape
    inter = two_i // 2
    out = torch.empty((n, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(n, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), I=inter,
                                                      BLOCK=block, num_warps=4)
    return out


@triton.jit
def _sample_kernel(LOGITS, TEMP, U, TOK, LP, stride_l, V, BLOCK: tl.constexpr, NB: tl.constexpr):
    # One program per row, three reads of its logits: (1) max, log-sum-exp and argmax, (2) the total of the running
    # mass, (3) the count of columns whose running mass stays <= u * total: that count is the drawn column, the same
    # rule as models/sampling._inverse_cdf (searchsorted, right=True). Passes 2 and 3 form the running mass with the
    # same code, so the total is the scan's own last value and the target always lands on a column of positive mass.
    row = tl.program_id(0)
    t = tl.load(TEMP + row)
    greedy = t == 0.0
    scale = tl.where(greedy, 1.0, t)
    base = LOGITS + row * stride_l
    offs0 = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int32)
    for b in range(NB):
        offs = b * BLOCK + offs0
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        bm = tl.max(x, 0)
        bi = tl.argmax(x, 0) + b * BLOCK
        best_i = tl.where(bm > best, bi, best_i)  # strict: the first column of the largest logit, as argmax
        best = tl.maximum(best, bm)
        z = x / scale
        m_new = tl.maximum(m, tl.max(z, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    total = tl.zeros([], tl.float32)
    for b in range(NB):
        offs = b * BLOCK + offs0
        z = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32) / scale
        total = tl.max(tl.cumsum(tl.exp(z - lse), 0) + total, 0)
    below = (total.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)  # the float just below total
    target = tl.minimum(tl.load(U + row) * total, below)
    carry = tl.zeros([], tl.float32)
    count = tl.zeros([], tl.int32)
    for b in range(NB):
        offs = b * BLOCK + offs0
        z = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32) / scale
        cdf = tl.cumsum(tl.exp(z - lse), 0) + carry
        count += tl.sum((cdf <= target).to(tl.int32), 0)
        carry = tl.max(cdf, 0)
    tok = tl.where(greedy, best_i, tl.minimum(count, V - 1))
    x_tok = tl.load(base + tok).to(tl.float32)
    tl.store(TOK + row, tok.to(tl.int64))
    tl.store(LP + row, x_tok / scale - lse)


def sample(logits, temperature, top_p, keys, steps, truncate):
    """models/sampling.sample in one launch for the untruncated draw (top_p = 1, what RL uses); top-p calls take
    the torch path. logits [B, V] in any float dtype (read as float32, as the torch path upcasts them)."""
    if truncate:
        return torch_sample(logits.float(), temperature, top_p, keys, steps, truncate)
    b, v = logits.shape
    u = uniform(keys, steps)
    tokens = torch.empty(b, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(b, dtype=torch.float32, device=logits.device)
    _sample_kernel[(b,)](logits, temperature, u, tokens, logprobs, logits.stride(0), v, BLOCK=SAMPLE_BLOCK,
                         NB=triton.cdiv(v, SAMPLE_BLOCK), num_warps=SAMPLE_WARPS)
    return tokens, logprobs
