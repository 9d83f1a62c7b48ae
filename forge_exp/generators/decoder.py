"""A static-KV decoder over the weights of an HF Qwen3 / Llama / Qwen2 causal LM, for the native engine.

It runs the same computation as the HF modules but over a flat list of tokens, each with its own cache slot and
position: a decode step is one token per running sequence, a prefill is the prompt tokens of the new sequences.
K/V are written into a preallocated cache first and each token then attends to positions [0, position] of its
slot — causal attention for a prefill, the whole live prefix for a decode step — so one layer loop serves both, and
no shape of a decode step depends on data (it can be captured in a CUDA graph).

Fused weights: q/k/v, gate/up and the two q/k norms are each concatenated into one buffer, and the HF parameters
become views into it. One GEMM reads them, and a copy into an HF parameter (load_weights) updates what it reads.
The decoder therefore takes over the storage of the model it is given: build one decoder per model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED = ("qwen3", "llama", "qwen2")


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the decoder cannot run `model` (the engine then takes its plain path), or None when it can."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED:
        return f"model_type {cfg.model_type!r} is not one of {', '.join(SUPPORTED)}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "sliding-window layers are not supported"
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim % 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not a power of two >= 16"
    return None


def _fuse(params: list[torch.Tensor | None]) -> torch.Tensor | None:
    """One buffer holding `params` back to back along dim 0; each parameter becomes a view into it."""
    if params[0] is None:
        return None
    buf = torch.cat([p.data for p in params], dim=0)
    offset = 0
    for p in params:
        p.data = buf[offset : offset + p.shape[0]]
        offset += p.shape[0]
    return buf


@dataclass
class _Layer:
    ln1: torch.Tensor  # [H]
    qkv_w: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    qkv_b: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [2 D] (Qwen3)
    o_w: torch.Tensor  # [H, Hq D]
    o_b: torch.Tensor | None
    ln2: torch.Tensor  # [H]
    gu_w: torch.Tensor  # [2 I, H]
    gu_b: torch.Tensor | None
    down_w: torch.Tensor  # [H, I]
    down_b: torch.Tensor | None


class StaticDecoder:
    def __init__(self, model: torch.nn.Module, *, slots: int, max_len: int, kernels) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"the native decoder cannot run this model: {reason}")
        cfg, inner = model.config, model.model
        self.kernels = kernels  # module with the fused steps: ops (torch) or triton_ops
        self.num_heads = cfg.num_attention_heads
        attn0 = inner.layers[0].self_attn
        self.scale = attn0.scaling
        self.eps = cfg.rms_norm_eps
        self.layers = []
        with torch.no_grad():
            for layer in inner.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append(_Layer(
                    ln1=layer.input_layernorm.weight,
                    qkv_w=_fuse([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    qkv_b=_fuse([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]),
                    qk_norm=_fuse([a.q_norm.weight, a.k_norm.weight]) if hasattr(a, "q_norm") else None,
                    o_w=a.o_proj.weight, o_b=a.o_proj.bias,
                    ln2=layer.post_attention_layernorm.weight,
                    gu_w=_fuse([m.gate_proj.weight, m.up_proj.weight]),
                    gu_b=_fuse([m.gate_proj.bias, m.up_proj.bias]),
                    down_w=m.down_proj.weight, down_b=m.down_proj.bias,
                ))
        self.embed = inner.embed_tokens.weight  # [V, H]
        self.norm = inner.norm.weight
        self.lm_head = model.lm_head.weight  # [V, H]; the embedding itself when tied
        weight = self.embed
        kv_heads, head_dim = a.k_proj.weight.shape[0] // a.head_dim, a.head_dim
        shape = (len(self.layers), slots + 1, kv_heads, max_len, head_dim)  # slot `slots` is scratch (ops.py)
        self.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        # The rotary table for every position, from the model's own rotary module (any rope scaling it has).
        with torch.no_grad():
            positions = torch.arange(max_len, device=weight.device)[None]
            cos, sin = inner.rotary_emb(torch.zeros(1, dtype=weight.dtype, device=weight.device), positions)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # [max_len, D]

    def prefill(self, prompts: list[list[int]], slots: torch.Tensor) -> torch.Tensor:
        """Write the K/V of every prompt into its slot [n]; return the logits [n, V] (model dtype) after each last token.

        Triton kernels take the prompts packed (no padding; each token attends to its slot's cache up to itself);
        the torch ops take them right-padded to the longest, with one causal SDPA per layer (padding sits after the
        real tokens, so causality keeps it out of their attention, and its K/V land past each prompt's end).
        """
        dev = slots.device
        sizes = [len(p) for p in prompts]
        lens, width = torch.tensor(sizes, device=dev), max(sizes)
        if self.kernels.PACKED_PREFILL:
            tokens = torch.tensor([t for p in prompts for t in p], device=dev)
            rows = torch.repeat_interleave(slots, lens, output_size=len(tokens))  # [N] slot of each token
            positions = torch.tensor([i for n in sizes for i in range(n)], device=dev)
            lengths = positions + 1
            attend = lambda q, kc, vc: self.kernels.attention(q, kc, vc, rows, lengths, width, self.scale)
            last = lens.cumsum(0) - 1
        else:
            tokens = torch.tensor([t for p in prompts for t in p + [0] * (width - len(p))], device=dev)
            rows = slots.repeat_interleave(width)
            positions = torch.arange(width, device=dev).repeat(len(prompts))
            attend = lambda q, kc, vc: self.kernels.prefill_attention(q, kc, vc, slots, width, self.scale)
            last = torch.arange(len(prompts), device=dev) * width + lens - 1
        return self._forward(tokens, rows, positions, attend, last)

    @torch.no_grad()
    def copy_prefix(self, copies: list[tuple[int, int, int]]) -> None:
        """For each (source slot, target slot, length), copy positions [0, length) of every layer's K/V."""
        groups: dict[tuple[int, int], list[int]] = {}
        for src, dst, length in copies:
            groups.setdefault((src, length), []).append(dst)
        for (src, length), dsts in groups.items():
            targets = torch.tensor(dsts, device=self.k_cache.device)
            for cache in (self.k_cache, self.v_cache):
                prefix = cache[:, :, :, :length]  # [layers, S + 1, Hkv, length, D] view
                prefix.index_copy_(1, targets, prefix[:, src : src + 1].expand(-1, len(dsts), -1, -1, -1))

    def decode(
        self,
        tokens: torch.Tensor,  # [B] long: each row's last token
        slots: torch.Tensor,  # [B] long
        positions: torch.Tensor,  # [B] long: the token's position (its K/V go there)
        kv_len: int | None = None,  # host bound on max(positions) + 1, or None (the whole cache; CUDA graphs)
        first_slot: int | None = None,  # set when slots == first_slot + arange(B): the cache is read as a view
        prefix: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([B] slot, [B] length) of each row's prompt
        # K/V when another slot holds them (kernels.SHARED_PREFIX: the samples of a prompt share its prefill)
    ) -> torch.Tensor:
        """One decode step of B rows: logits [B, V] in the model dtype."""
        lengths = positions + 1  # once a step, not once a layer: a kernel launch each
        if prefix is not None:
            attend = lambda q, kc, vc: self.kernels.attention(q, kc, vc, slots, lengths, kv_len, self.scale, prefix)
        elif first_slot is not None and self.kernels.SLOT_WINDOW:
            window = slice(first_slot, first_slot + len(tokens))
            attend = lambda q, kc, vc: self.kernels.attention(q, kc[window], vc[window], None, lengths, kv_len,
                                                              self.scale)
        else:
            attend = lambda q, kc, vc: self.kernels.attention(q, kc, vc, slots, lengths, kv_len, self.scale)
        return self._forward(tokens, slots, positions, attend, None)

    @torch.no_grad()
    def _forward(self, tokens, slots, positions, attend, last) -> torch.Tensor:
        """The layers over N rows (token, slot, position each); `attend(q, k_cache, v_cache)` is the attention.
        Returns the logits of rows `last` (all rows when None)."""
        k = self.kernels
        x = F.embedding(tokens, self.embed)  # [N, H]
        cos, sin = self.cos[positions], self.sin[positions]  # [N, D]
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = k.add_rms_norm(x, residual, layer.ln1, self.eps)
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b)
            kc, vc = self.k_cache[i], self.v_cache[i]
            q = k.qk_rope_store(qkv, layer.qk_norm, self.eps, cos, sin, positions, slots, kc, vc, self.num_heads)
            x = F.linear(attend(q, kc, vc).flatten(1), layer.o_w, layer.o_b)
            h, residual = k.add_rms_norm(x, residual, layer.ln2, self.eps)
            x = F.linear(k.silu_mul(F.linear(h, layer.gu_w, layer.gu_b)), layer.down_w, layer.down_b)
        if last is not None:
            x, residual = x[last], residual[last]
        h, _ = k.add_rms_norm(x, residual, self.norm, self.eps)
        return F.linear(h, self.lm_head)  # the sampler reads them as float32 (ops.sample)
