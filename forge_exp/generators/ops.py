"""The decoder's fused steps in plain torch: the reference for `triton_ops.py`, and the path on CPU.

Each function is one fused kernel in `triton_ops.py` with the same signature. Numerics follow the HF Qwen3/Llama
modules: the residual stream stays in the model dtype, norms compute in float32 and round before the weight.

KV cache layout, one tensor per layer: `[slots + 1, kv_heads, max_len, head_dim]` (a slot's positions of one head
are contiguous); slot `slots` is a scratch row that padding rows of a batch write to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from forge_exp.models import sampling

PACKED_PREFILL = False  # prefill takes prompts right-padded: one causal SDPA per layer (see decoder.prefill)
SLOT_WINDOW = True  # attention also takes a view of consecutive slots (slots=None), which saves a gather per layer
SHARED_PREFIX = False  # the samples of a prompt get copies of its K/V (a window of slots reads them with no gather)


def add_rms_norm(
    x: torch.Tensor,  # [N, H]
    residual: torch.Tensor | None,  # [N, H] or None (first layer: x is the residual stream)
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual) * weight, x + residual)`, both [N, H]."""
    h = x if residual is None else residual + x
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(h.dtype), h


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_rope_store(
    qkv: torch.Tensor,  # [N, (Hq + 2 Hkv) D]: q heads, then k heads, then v heads
    qk_norm: torch.Tensor | None,  # [2 D]: q_norm weight then k_norm weight (Qwen3), or None (Llama)
    eps: float,
    cos: torch.Tensor,  # [N, D] rotary cos of each row's position (model dtype), gathered once per forward
    sin: torch.Tensor,  # [N, D]
    positions: torch.Tensor,  # [N] long
    slots: torch.Tensor,  # [N] long
    k_cache: torch.Tensor,  # [S + 1, Hkv, max_len, D]
    v_cache: torch.Tensor,  # [S + 1, Hkv, max_len, D]
    num_heads: int,
) -> torch.Tensor:
    """Per-head RMS norm (when given) and rotary embedding; k and v go into the cache at (slot, position).
    Returns q [N, Hq, D]."""
    n, kv_heads, max_len, d = qkv.shape[0], k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    qk = qkv[:, : (num_heads + kv_heads) * d].view(n, num_heads + kv_heads, d)  # q and k heads, normed together
    if qk_norm is not None:
        weight = torch.cat([qk_norm[:d].expand(num_heads, d), qk_norm[d:].expand(kv_heads, d)])  # [Hq + Hkv, D]
        qk = add_rms_norm(qk, None, weight, eps)[0]
    qk = qk * cos[:, None] + _rotate_half(qk) * sin[:, None]
    # Flat row of (slot, head, position) in the cache viewed as [(S + 1) Hkv max_len, D]: one index_copy_ each.
    heads = torch.arange(kv_heads, device=qkv.device)
    rows = ((slots[:, None] * kv_heads + heads) * max_len + positions[:, None]).flatten()  # [N Hkv]
    k_cache.view(-1, d).index_copy_(0, rows, qk[:, num_heads:].reshape(-1, d))
    v_cache.view(-1, d).index_copy_(0, rows, qkv[:, (num_heads + kv_heads) * d :].reshape(-1, d))
    return qk[:, :num_heads]


def attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [S + 1, Hkv, max_len, D]
    v_cache: torch.Tensor,
    slots: torch.Tensor | None,  # [N] long; None: row n reads slot n of the given cache (a view, no gather)
    lengths: torch.Tensor,  # [N] long: row n attends to cache positions [0, lengths[n]) of its slot
    kv_len: int | None,  # host-side bound on max(lengths): only that much of the cache is read (None = all)
    scale: float,
    prefix: tuple[torch.Tensor, torch.Tensor] | None = None,  # (slot [N], length [N]): positions below the length
    # are read from that slot instead (a prompt's K/V, prefilled once for all its samples); needs `slots`
) -> torch.Tensor:
    """Each row's query against the live part of its slot's cache (GQA): out [N, Hq, D]."""
    n, num_heads, d = q.shape
    if slots is None:
        k, v = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]  # [N, Hkv, T, D]
    else:
        k, v = k_cache[slots, :, :kv_len], v_cache[slots, :, :kv_len]
    if prefix is not None:
        shared = (torch.arange(k.shape[2], device=q.device)[None] < prefix[1][:, None])[:, None, :, None]
        k = torch.where(shared, k_cache[prefix[0], :, :kv_len], k)
        v = torch.where(shared, v_cache[prefix[0], :, :kv_len], v)
    live = torch.arange(k.shape[2], device=q.device)[None] < lengths[:, None]  # [N, T]
    # The G query heads of a kv head go in as G query positions of one head: the same scores, no GQA expansion.
    qg = q.view(n, k.shape[1], num_heads // k.shape[1], d)  # [N, Hkv, G, D]
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=live[:, None, None], scale=scale)  # [N, Hkv, G, D]
    return out.reshape(n, num_heads, d)


def prefill_attention(
    q: torch.Tensor,  # [n P, Hq, D]: n prompts right-padded to P, row-major
    k_cache: torch.Tensor,  # [S + 1, Hkv, max_len, D], already holding the prompts' K/V at positions [0, P)
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [n] long
    width: int,  # P
    scale: float,
) -> torch.Tensor:
    """Causal attention of each padded prompt over its own positions: out [n P, Hq, D]."""
    num_heads, d = q.shape[1], q.shape[2]
    qs = q.view(len(slots), width, num_heads, d).transpose(1, 2)  # [n, Hq, P, D]
    k, v = k_cache[slots, :, :width], v_cache[slots, :, :width]  # [n, Hkv, P, D]
    out = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(-1, num_heads, d)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [N, 2 I] = [gate | up]: [N, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def sample(logits, temperature, top_p, keys, steps, truncate):
    """models/sampling.sample over logits [B, V] in the model's dtype: upcast to float32 first (exact)."""
    return sampling.sample(logits.float(), temperature, top_p, keys, steps, truncate)
