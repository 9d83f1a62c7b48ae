"""Qwen3 causal LMs in plain torch, with transformers' parameter names and checkpoint format.

Why not transformers' `Qwen3ForCausalLM`: importing its modeling code takes 1.2-2.2 s on a 2-core machine
(`modeling_utils` pulls in torch._dynamo, torch.distributed.tensor and scipy.optimize, unconditionally), and every
process of the embedded default waits for it before its first step; this module imports torch alone. What the
platform does with a model — the trainer's forward (models/logprobs.py, trainers/sft.py), the engines of
generators/ (decoder.py reads the same submodules), weight sync by parameter name, HF-format checkpoints — works on
either. The tiny model (models/tiny.py) is built with this; released models load through transformers
(models/hf.py).

The computation is transformers 5.x's Qwen3 (modeling_qwen3.py) with SDPA attention: pre-norm decoder layers, RMSNorm
on each head's q and k before rotary embeddings, grouped-query attention, SwiGLU MLP. Departures: no sliding-window
layers, no rope scaling (both are refused when reading config.json), no attention dropout; a fully padded query row
attends to itself (transformers' SDPA path gives such a row another finite value; pad rows are masked out of every
result either way). tests/models/test_qwen3.py checks logits, gradients and checkpoints against transformers.

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=..., hidden_size=..., ...))
    model.save_pretrained(d)                        # loads with transformers.AutoModelForCausalLM.from_pretrained(d)
    model = Qwen3ForCausalLM.from_pretrained(d)     # a directory transformers wrote, or this class
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from forge_exp.models.qwen3_config import Qwen3Config

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


class CausalLMOutput(NamedTuple):
    logits: torch.Tensor  # [B, T, V] (the last `logits_to_keep` positions when that is set)
    past_key_values: "KVCache | None" = None


class ModelOutput(NamedTuple):
    last_hidden_state: torch.Tensor  # [B, T, H] after the final norm
    past_key_values: "KVCache | None" = None


class KVCache:
    """Keys and values of the positions seen so far, per layer (models/generate.py's cache for this model)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def get_seq_length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `k`, `v` [B, Hkv, T, D] to layer `layer`; return all of that layer's keys and values so far."""
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in float32, as transformers' Qwen3RMSNorm; the weight multiplies the result in the input's dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos and sin [B, T, D] of each position (the default rotary embedding; no buffer, so no dtype casts reach it)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=x.device).float()
        inv_freq = 1.0 / (self.theta ** (steps / self.head_dim))  # [D/2]
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = position_ids[..., None].float() * inv_freq  # [B, T, D/2]
            emb = torch.cat([freqs, freqs], dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D] rotated by its positions' angles (cos, sin [B, T, D]); the half-split layout of HF."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer: int):
        super().__init__()
        self.layer, self.head_dim, self.eager = layer, cfg.head_dim, cfg.attn_implementation == "eager"
        self.scaling = cfg.head_dim**-0.5
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin [B, T, D]
        mask: torch.Tensor | None,  # [B, 1, T, K] bool, True = may attend; None = causal
        cache: KVCache | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, -1, self.head_dim)).transpose(1, 2)  # [B, Hq, T, D]
        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.head_dim)).transpose(1, 2)  # [B, Hkv, T, D]
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, *rope), rotate(k, *rope)
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        # grouped-query attention as transformers runs it: inside SDPA when no mask is needed, else each kv head
        # repeated (the same kernels, so the same numbers)
        gqa = self.num_kv_heads != self.num_heads
        if gqa and (mask is not None or self.eager):
            k, v = repeat_kv(k, self.num_heads // self.num_kv_heads), repeat_kv(v, self.num_heads // self.num_kv_heads)
            gqa = False
        if self.eager:
            out = eager_attention(q, k, v, mask, self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                                 scale=self.scaling, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, Hkv, T, D] → [B, Hkv·n, T, D], each kv head n times in a row (by expand, as transformers does)."""
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, n, T, D).reshape(B, H * n, T, D)


def eager_attention(q, k, v, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) v written out, the softmax in float32 (transformers' eager attention)."""
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, Hq, T, K]
    if mask is None:  # causal: the T queries are the last T of the K positions
        T, K = scores.shape[-2:]
        mask = torch.ones(T, K, dtype=torch.bool, device=q.device).tril(K - T)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")).float(), dim=-1).to(q.dtype)
    return weights @ v


class MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rope, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), rope, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


def build_mask(
    attention_mask: torch.Tensor | None,  # [B, K] 1 = real token (the cached and the new positions), or ready 4D
    position_ids: torch.Tensor,  # [B, T] of the new positions
    past: int,  # positions already in the cache (K = past + T)
) -> torch.Tensor | None:
    """[B, 1, T, K] bool (True = may attend), or None where causal attention alone is exact.

    Query t sits at index past + t and sees the keys at or before it that the padding mask keeps. Without a padding
    mask, rows whose position ids restart (packed examples, trainers/sft.py) see only their own example, as
    transformers derives it (a new example wherever a position is not the one before it plus one). A query that
    would see nothing (left padding) sees itself, so that it gives a finite value instead of NaN. A mask that is
    already [B, 1, T, K] (models/packing.py's) is used as it is, as transformers does."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask.bool()
    B, T = position_ids.shape
    if past == 0 and attention_mask is None:
        starts = torch.diff(position_ids, dim=-1) != 1
        if not bool(starts.any()):
            return None
    elif past == 0 and bool(attention_mask.all()):
        return None  # no padding: causal alone (transformers skips such a mask the same way)
    K = past + T
    q = torch.arange(past, K, device=position_ids.device)[:, None]
    k = torch.arange(K, device=position_ids.device)[None, :]
    allowed = (k <= q)[None].expand(B, T, K)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, :].bool()
    elif past == 0:
        example = F.pad(starts, (1, 0)).cumsum(-1)  # [B, T] which packed example each position belongs to
        allowed = allowed & (example[:, :, None] == example[:, None, :])
    return (allowed | ((k == q)[None] & ~allowed.any(-1, keepdim=True)))[:, None]


class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.gradient_checkpointing = False

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T] long
        attention_mask: torch.Tensor | None = None,  # [B, past + T], or a ready [B, 1, T, past + T] bool
        position_ids: torch.Tensor | None = None,  # [B, T]
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
    ) -> ModelOutput:
        B, T = input_ids.shape
        cache = past_key_values if past_key_values is not None or not use_cache else KVCache()
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=input_ids.device).expand(B, T)
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb(x, position_ids)
        mask = build_mask(attention_mask, position_ids, past)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, rope, mask, cache, use_reentrant=False)
            else:
                x = layer(x, rope, mask, cache)
        return ModelOutput(self.norm(x), cache)


class Qwen3ForCausalLM(nn.Module):
    """The module tree and parameter names of transformers' Qwen3ForCausalLM (`model.layers.0.self_attn.q_proj.weight`,
    ..., `lm_head.weight`), and the calls of it the platform makes."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config)
        # A tied head is the embedding: its own init draws from a forked RNG (transformers' leaves the global one
        # untouched there), so that the random init below draws what transformers' Qwen3ForCausalLM draws under
        # the same seed
        with torch.random.fork_rng(devices=[], enabled=config.tie_word_embeddings):
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.init_weights()

    def init_weights(self) -> None:
        """transformers' initialisation, in its order: normal(0, initializer_range) for each linear and embedding
        weight once (a tied head is the embedding), zero biases and padding embedding; norms stay at one."""
        std, drawn = self.config.initializer_range, set()
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)) and id(m.weight) not in drawn:
                    drawn.add(id(m.weight))
                    m.weight.normal_(0.0, std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.zero_()
                if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def get_decoder(self) -> Qwen3Model:
        return self.model

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each decoder layer in the backward pass (non-reentrant, whatever the kwargs say)."""
        self.model.gradient_checkpointing = True

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T] long
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        logits_to_keep: int = 0,
    ) -> CausalLMOutput:
        out = self.model(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        h = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return CausalLMOutput(self.lm_head(h), out.past_key_values)

    def new_cache(self) -> KVCache:
        return KVCache()

    # ---- checkpoints in transformers' format ------------------------------------------------------------------

    def save_pretrained(self, directory: str | Path) -> None:
        """config.json and model.safetensors as transformers writes them (the tied head is not stored)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self.config.to_dict(self.dtype)
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        tied = self.config.tie_word_embeddings
        tensors = {k: t.detach().contiguous() for k, t in self.state_dict().items()
                   if not (tied and k == "lm_head.weight")}
        save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32,
                        attn_implementation: str = "sdpa") -> "Qwen3ForCausalLM":
        """Read a directory of config.json and safetensors weights (one file or an index of shards)."""
        from safetensors.torch import load_file

        directory = Path(directory).expanduser()
        config = Qwen3Config.from_dict(json.loads((directory / "config.json").read_text()),
                                       where=str(directory / "config.json"))
        config.attn_implementation = attn_implementation
        if (directory / WEIGHTS_INDEX).is_file():
            shards = sorted(set(json.loads((directory / WEIGHTS_INDEX).read_text())["weight_map"].values()))
        else:
            shards = [WEIGHTS]
        weights = {}
        for shard in shards:
            weights.update(load_file(str(directory / shard)))
        # Built on the CPU and then given the weights read (the meta device would import torch._dynamo, ~1 s, for its
        # init ops); the initialisation it runs for nothing leaves the caller's RNG state as it was.
        with torch.random.fork_rng(devices=[]):
            model = cls(config)
        expected = set(model.state_dict())
        if config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
            expected.discard("lm_head.weight")
        if missing := sorted(expected - set(weights)):
            raise ValueError(f"{directory}: the weights lack {', '.join(missing[:3])}"
                             f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}")
        if extra := sorted(set(weights) - expected):
            raise ValueError(f"{directory}: unexpected weights {', '.join(extra[:3])} (not a Qwen3 causal LM?)")
        model.load_state_dict({k: t.to(dtype) for k, t in weights.items()}, strict=False, assign=True)
        model.tie_weights()
        return model
