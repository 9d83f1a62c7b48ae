"""TorchTitan Qwen3 / Llama 3 models built from a Hugging Face `config.json`, and the name map between the two.

The dimensions come from the checkpoint's config (never from a flavour table), the building blocks from TorchTitan
(`Qwen3Model` / `Llama3Model` configs, `make_gqa_config`, `make_ffn_config`, fused QKV, its RoPE modules), so its
`parallelize_qwen3` / `parallelize_llama` apply their own TP plans, FSDP2 wrapping, activation checkpointing and
compile to them.

Departures from TorchTitan's registry flavours (why):
- inner attention is SDPA (causal) or flex with a plain causal mask, never TorchTitan's document mask: the trainer
  packs each row's real tokens to the left (models/packing.py), so causal attention is exact and no mask is built.
  TorchTitan's `get_attention_config("sdpa")` refuses SDPA for language models, so the config is set directly.
  With `share_prompts` the rows of a prompt are one sequence and attention takes their mask: a flex BlockMask, or a
  bool tensor that `masked_sdpa` hands to SDPA (TorchTitan's SDPA takes no mask).
- RMSNorm eps and RoPE theta / Llama-3 scaling are read from config.json.

Names: HF ↔ TorchTitan by the TorchTitan state-dict adapter's own table (`from_hf_map`) and, for Llama, its q/k
permutation (ComplexRoPE's interleaved layout vs HF's rotate-half), applied one tensor at a time. The adapter's
whole-dict `from_hf`/`to_hf` are not used: they assume the whole state dict in memory (e.g. the tied-embedding
assertion in Qwen3's `from_hf`). The fused `wqkv` parameter is split/merged by TorchTitan's own `FusedQKVLinear`
state-dict hooks, called directly.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from forge_exp.trainers.titan_compat import titan

FAMILIES = {"qwen3": "qwen3", "llama": "llama3"}  # HF model_type → TorchTitan model family


@dataclass(frozen=True)
class Arch:
    """The dimensions of a dense decoder, read from an HF config.json."""

    family: str  # "qwen3" | "llama3"
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    norm_eps: float
    rope_theta: float
    max_seq_len: int
    tied: bool
    rope_scaling: dict | None = None  # Llama-3 "llama3" rope scaling (factor, low/high_freq_factor, original_max...)

    @property
    def num_params(self) -> int:
        attn = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        norms = 2 * self.dim + (2 * self.head_dim if self.family == "qwen3" else 0)
        layer = attn + 3 * self.dim * self.hidden_dim + norms
        return self.n_layers * layer + self.vocab_size * self.dim * (1 if self.tied else 2) + self.dim


def read_hf_config(path_or_config: str | Path | dict) -> dict:
    if isinstance(path_or_config, dict):
        return path_or_config
    p = Path(path_or_config).expanduser()
    return json.loads((p / "config.json" if p.is_dir() else p).read_text())


def arch_from_hf(config: dict) -> Arch:
    """The Arch of an HF config dict; ValueError (naming the key) for what TorchTitan's dense decoders do not cover."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"trainer=titan supports model_type {sorted(FAMILIES)} (config.json), got {model_type!r}")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"trainer=titan: config.json {key}=true is not supported by TorchTitan's {model_type}")
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3") or (rope_type == "llama3" and model_type != "llama"):
        raise ValueError(f"trainer=titan: rope_type {rope_type!r} (config.json) is not supported for {model_type}")
    n_heads = int(config["num_attention_heads"])
    return Arch(
        family=FAMILIES[model_type],
        vocab_size=int(config["vocab_size"]),
        dim=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // n_heads),
        hidden_dim=int(config["intermediate_size"]),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_seq_len=int(config.get("max_position_embeddings", 4096)),
        tied=bool(config.get("tie_word_embeddings", False)),
        rope_scaling=rope if rope_type == "llama3" else None,
    )


@functools.cache
def masked_sdpa() -> type:
    """TorchTitan's SDPA inner attention, which also takes a bool mask [B, 1, L, L] as `attention_masks` (True:
    attends; the prompt-sharing layout of models/packing.py). Without one it is TorchTitan's causal SDPA."""
    titan()
    import torch.nn.functional as F
    from torchtitan.models.common.attention import ScaledDotProductAttention

    class MaskedSDPA(ScaledDotProductAttention):
        @dataclass(kw_only=True, slots=True)
        class Config(ScaledDotProductAttention.Config):
            pass

        # (the parent's argument names: TorchTitan's TP wrapper maps its shardings by them)
        def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False, **kwargs):
            if attention_masks is None:
                return super().forward(q_BLNH, k_BLNH, v_BLNH, scale=scale, enable_gqa=enable_gqa, **kwargs)
            q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))  # (B, N, L, H) for SDPA
            if enable_gqa:  # each query head's key/value head repeated: the memory-efficient kernel, which takes a
                k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))  # mask, has no GQA
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_masks, scale=scale)
            return out.transpose(1, 2)

    return MaskedSDPA


def titan_config(arch: Arch, attention: str = "sdpa", masked: bool = False):
    """TorchTitan `Qwen3Model.Config` / `Llama3Model.Config` for `arch`, built from TorchTitan's blocks. `masked`:
    attention takes a mask (share_prompts); SDPA is then `masked_sdpa`'s."""
    titan()
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.common.param_init import skip_param_init

    if attention not in ("sdpa", "flex"):
        raise ValueError(f"trainer attention must be 'sdpa' or 'flex', got {attention!r}")
    linear = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}  # random init (benchmarks)
    ones = {"weight": nn.init.ones_}
    norm = partial(RMSNorm.Config, eps=arch.norm_eps, param_init=ones)
    if arch.family == "qwen3":
        from torchtitan.models.qwen3 import Qwen3Model as Model, Qwen3TransformerBlock as Block

        rope = CosSinRoPE.Config(dim=arch.head_dim, max_seq_len=arch.max_seq_len, theta=arch.rope_theta)
        qk_norm = norm(normalized_shape=arch.head_dim)
    else:
        from torchtitan.models.llama3 import Llama3Model as Model, Llama3TransformerBlock as Block

        s = arch.rope_scaling or {}
        rope = ComplexRoPE.Config(
            dim=arch.head_dim, max_seq_len=arch.max_seq_len, theta=arch.rope_theta,
            scaling="llama" if s else "none", scaling_factor=float(s.get("factor", 8.0)),
            low_freq_factor=float(s.get("low_freq_factor", 1.0)), high_freq_factor=float(s.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(s.get("original_max_position_embeddings", 8192)),
        )
        qk_norm = None
    sdpa = masked_sdpa() if masked else ScaledDotProductAttention
    inner = sdpa.Config() if attention == "sdpa" else FlexAttention.Config()
    layers = [
        Block.Config(
            attention_norm=norm(normalized_shape=arch.dim),
            ffn_norm=norm(normalized_shape=arch.dim),
            attention=make_gqa_config(
                dim=arch.dim, n_heads=arch.n_heads, n_kv_heads=arch.n_kv_heads, head_dim=arch.head_dim,
                wqkv_param_init=linear, wo_param_init=linear, inner_attention=inner, fuse_qkv=True, rope=rope,
                qk_norm=qk_norm,
            ),
            feed_forward=make_ffn_config(
                dim=arch.dim, hidden_dim=arch.hidden_dim, w1_param_init=linear, w2w3_param_init=linear
            ),
        )
        for _ in range(arch.n_layers)
    ]
    embed_init = {"weight": skip_param_init} if arch.tied else {"weight": partial(nn.init.normal_, std=0.02)}
    return Model.Config(
        vocab_size=arch.vocab_size,
        dim=arch.dim,
        norm=norm(normalized_shape=arch.dim),
        enable_weight_tying=arch.tied,
        tok_embeddings=Embedding.Config(num_embeddings=arch.vocab_size, embedding_dim=arch.dim, param_init=embed_init),
        lm_head=Linear.Config(in_features=arch.dim, out_features=arch.vocab_size, param_init=linear),
        layers=layers,
    )


def parallelize_fn(arch: Arch):
    titan()
    if arch.family == "qwen3":
        from torchtitan.models.qwen3 import parallelize_qwen3

        return parallelize_qwen3
    from torchtitan.models.llama3 import parallelize_llama

    return parallelize_llama


def clean_fqn(name: str) -> str:
    """A parameter's name without the wrappers' path parts (activation checkpointing, compile)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


@dataclass
class NameMap:
    """HF ↔ TorchTitan, per parameter. `plan` lists, in the HF model's own parameter order, each TorchTitan parameter
    with the HF tensors it holds (three for a fused wqkv)."""

    arch: Arch
    model_config: Any  # the TorchTitan model config (for the adapter)
    plan: list[tuple[str, list[str]]]  # (clean titan fqn, [hf names])
    hf_shapes: dict[str, tuple[int, ...]]

    def __post_init__(self):
        self.hf_names = dict(self.plan)  # titan fqn → its HF names

    @classmethod
    def build(cls, arch: Arch, model_config: Any, hf_config: dict, titan_names: list[str]) -> "NameMap":
        adapter = _adapter(arch, model_config)
        to_hf = {v: k for k, v in adapter.from_hf_map.items() if v is not None}
        owner: dict[str, tuple[str, list[str]]] = {}
        for fqn in titan_names:
            parts = [fqn.replace("wqkv.", w + ".") for w in ("wq", "wk", "wv")] if ".wqkv." in fqn else [fqn]
            hf_names = []
            for part in parts:
                abstract = re.sub(r"\.(\d+)\.", ".{}.", part, count=1)
                layer = re.search(r"\.(\d+)\.", part)
                hf = to_hf.get(abstract)
                if hf is None:
                    raise ValueError(f"trainer=titan: no HF name for TorchTitan parameter {fqn!r}")
                hf_names.append(hf.format(layer.group(1)) if layer else hf)
            owner[fqn] = (fqn, hf_names)
        hf_shapes = hf_parameter_shapes(hf_config)
        plan, seen = [], set()
        by_hf = {h: fqn for fqn, (_, hs) in owner.items() for h in hs}
        for h in hf_shapes:
            if h not in by_hf:
                raise ValueError(f"trainer=titan: HF parameter {h!r} has no TorchTitan counterpart")
            if by_hf[h] not in seen:
                seen.add(by_hf[h])
                plan.append(owner[by_hf[h]])
        flat = [h for _, hs in plan for h in hs]
        if flat != list(hf_shapes):  # fused q/k/v must be adjacent in HF order so the stream keeps that order
            raise ValueError("trainer=titan: HF parameter order cannot be streamed from the TorchTitan parameters")
        return cls(arch, model_config, plan, hf_shapes)

    def to_hf(self, fqn: str, full: torch.Tensor, qkv_module: nn.Module | None) -> list[tuple[str, torch.Tensor]]:
        """The HF tensors of TorchTitan parameter `fqn`, given its full (unsharded) value."""
        hf_names = self.hf_names[fqn]
        if qkv_module is not None:
            sd = {"wqkv.weight": full}
            type(qkv_module)._split_qkv_on_save(qkv_module, sd, "", None)
            tensors = [sd["wq.weight"], sd["wk.weight"], sd["wv.weight"]]
        else:
            tensors = [full]
        return [(h, self._permute(h, t, forward=True)) for h, t in zip(hf_names, tensors)]

    def from_hf(self, fqn: str, hf: dict[str, torch.Tensor], qkv_module: nn.Module | None) -> torch.Tensor:
        """The full TorchTitan value of parameter `fqn` from its HF tensors (`hf`: HF name → tensor)."""
        hf_names = self.hf_names[fqn]
        tensors = [self._permute(h, hf[h], forward=False) for h in hf_names]
        if qkv_module is None:
            return tensors[0]
        sd = dict(zip(("wq.weight", "wk.weight", "wv.weight"), tensors))
        type(qkv_module)._merge_qkv_on_load(qkv_module, sd, "")
        return sd["wqkv.weight"]

    def permuted(self, hf_name: str) -> bool:
        """Llama: TorchTitan's ComplexRoPE pairs adjacent dims, HF rotates halves; q/k rows are permuted between."""
        return self.arch.family == "llama3" and hf_name.endswith(("q_proj.weight", "k_proj.weight"))

    def _permute(self, hf_name: str, t: torch.Tensor, forward: bool) -> torch.Tensor:
        if not self.permuted(hf_name):
            return t
        heads = self.arch.n_heads if hf_name.endswith("q_proj.weight") else self.arch.n_kv_heads
        adapter = _adapter(self.arch, self.model_config)
        fn = adapter._permute if forward else adapter._reverse_permute
        return fn(t, heads, heads * self.arch.head_dim, self.arch.dim)


def _adapter(arch: Arch, model_config: Any):
    titan()
    if arch.family == "qwen3":
        from torchtitan.models.qwen3 import Qwen3StateDictAdapter as Adapter
    else:
        from torchtitan.models.llama3 import Llama3StateDictAdapter as Adapter
    return Adapter(model_config, None)


def hf_parameter_shapes(hf_config: dict) -> dict[str, tuple[int, ...]]:
    """The HF model's parameters (tied ones once), in its own order, with shapes: built on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(hf_config)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}
