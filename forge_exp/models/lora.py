"""LoRA adapters through peft (Hu et al. 2021, https://arxiv.org/abs/2106.09685): the trainer wraps its model with
`attach`, the generators rebuild the adapted weights from the adapter alone, checkpoints are peft's adapter format.

    lora = Lora.of(spec.lora)                      # None: full-parameter training (model.lora.rank=null)
    model = attach(base, lora)                     # a peft.PeftModel: only lora_A / lora_B require grad
    with model.disable_adapter(): ...              # the base itself: the reference model of a LoRA run
    adapter_parameters(model)                      # what weight sync sends, by peft's saved names
    AdapterMerge(base, lora).merged(adapter)       # the generator's weights W0 + (B @ A) * alpha / r

An adapter directory (adapter_config.json + adapter_model.safetensors, written by PeftModel.save_pretrained) names
its base in `base_model_name_or_path`; `model.path=<adapter dir>` loads that base with the adapter merged
(models/hf.py), and `forge-exp-merge <adapter dir> <out dir>` (models/merge.py) writes the merged model as an HF
checkpoint. peft is imported only where adapters are used: `pip install 'forge-exp[lora]'`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import torch

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER_CONFIG = "adapter_config.json"
INSTALL = "pip install 'forge-exp[lora]'"
# What model.lora.target_modules=null adapts: every projection of attention and MLP (attention-only LoRA falls
# behind: "LoRA Without Regret", Schulman et al. 2025, https://thinkingmachines.ai/blog/lora/). The tiny model is a
# Qwen3.
DEFAULT_TARGETS = {
    arch: ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for arch in ("qwen3", "llama", "qwen2")
}
PREFIX = "base_model.model."  # peft's prefix of every adapter tensor name (in the model and in its files)


def require_peft():
    try:
        import peft
    except ImportError as e:
        raise ImportError(f"model.lora needs peft, which is not installed: {INSTALL} ({e})") from None
    return peft


@dataclass(frozen=True)
class Lora:
    """The adapters of model.lora (config/model.py: LoraConfig states the defaults and ranges)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...] | None  # None: DEFAULT_TARGETS of the model's architecture
    layers: tuple[int, ...] | None  # None: every decoder layer

    @classmethod
    def of(cls, node: dict | None) -> "Lora | None":
        """From the model node's `lora` mapping; None when LoRA is off (rank null)."""
        if not node or node.get("rank") is None:
            return None
        tup = lambda v: tuple(v) if v is not None else None
        return cls(int(node["rank"]), float(node["alpha"]), float(node["dropout"]), tup(node["target_modules"]),
                   tup(node["layers"]))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def targets(self, model: torch.nn.Module) -> tuple[str, ...]:
        """The module names to adapt in `model`; ValueError naming what it has when one is missing."""
        arch = getattr(getattr(model, "config", None), "model_type", None)
        has = linear_names(model)
        if self.target_modules is None:
            if arch not in DEFAULT_TARGETS:
                raise ValueError(f"model.lora.target_modules: no default for model_type {arch!r}; name them "
                                 f"(the model's linear modules: {', '.join(has)})")
            return DEFAULT_TARGETS[arch]
        missing = [t for t in self.target_modules if t not in has]
        if missing:
            raise ValueError(f"model.lora.target_modules: the model has no {', '.join(missing)}; its linear modules "
                             f"are {', '.join(has)}")
        return self.target_modules

    def check(self, model: torch.nn.Module) -> None:
        """Target modules and layers exist in `model` (ValueError naming what it has)."""
        self.targets(model)
        count = len(getattr(getattr(model, "model", None), "layers", []))
        if self.layers is not None and count and max(self.layers) >= count:
            raise ValueError(f"model.lora.layers: the model has layers 0..{count - 1}, got {max(self.layers)}")

    def peft_config(self, model: torch.nn.Module):
        peft = require_peft()
        return peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                               target_modules=list(self.targets(model)),
                               layers_to_transform=list(self.layers) if self.layers is not None else None,
                               layers_pattern="layers" if self.layers is not None else None)


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's linear modules, the output head aside (what target_modules match)."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return sorted(names - {"lm_head"})


def attach(model: torch.nn.Module, lora: Lora, adapter: str | None = None, base: str | None = None) -> PeftModel:
    """`model` with trainable adapters: a fresh one (lora_B = 0, so the output is the base's), or the adapter
    directory `adapter` to train further. Every base parameter is frozen (it keeps its dtype); the adapters are
    float32. `base`: where the base comes from, recorded in the adapter's files (base_model_name_or_path)."""
    peft = require_peft()
    if adapter is not None:
        wrapped = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    else:
        lora.check(model)
        wrapped = peft.get_peft_model(model, lora.peft_config(model))
    wrapped.peft_config["default"].base_model_name_or_path = base
    return wrapped


def adapter_parameters(model: PeftModel) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors by the names peft saves them under (`...q_proj.lora_A.weight`), in the
    model's order: what weight sync publishes (live parameters: the optimizer updates them in place)."""
    return {n.replace(".default.", "."): p for n, p in model.named_parameters() if p.requires_grad}


def adapter_layout(model: torch.nn.Module, lora: Lora) -> dict[str, torch.Tensor]:
    """The adapter tensors `attach(model, lora)` would publish, as meta tensors (names, shapes, float32), read off
    the base model without wrapping it: a generator's side of the weight-sync layout."""
    from peft.tuners.tuners_utils import check_target_module_exists

    config = lora.peft_config(model)
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and check_target_module_exists(config, name):
            for part, shape in (("lora_A", (lora.rank, module.in_features)),
                                ("lora_B", (module.out_features, lora.rank))):
                out[f"{PREFIX}{name}.{part}.weight"] = torch.empty(shape, dtype=torch.float32, device="meta")
    return out


class AdapterMerge:
    """A generator's weights from adapter pushes alone: it keeps the base values W0 of the adapted weights and
    turns each adapter into the merged weights W0 + (B @ A) · alpha / r, computed as peft's
    `LoraLayer.get_delta_weight` and `merge` compute them (so the result is peft's merge_and_unload, bit for bit
    in float32). Recomputed from W0 on every push, never W += ΔW − ΔW_old: no rounding builds up over versions.

    Why merged rather than a low-rank side path at generation: docs/models_and_data.md (LoRA) has the CPU
    measurement; a merged model decodes at the base model's speed, and a push costs one small GEMM per weight."""

    def __init__(self, model: torch.nn.Module, lora: Lora):
        self.lora = lora
        self.layout = adapter_layout(model, lora)
        params = dict(model.named_parameters())
        self.base = {}  # name of the adapted weight -> its base values
        for name in self.layout:
            weight = name[len(PREFIX):].rsplit(".", 2)[0] + ".weight"  # ...q_proj.lora_A.weight -> ...q_proj.weight
            if weight not in self.base:
                self.base[weight] = params[weight].detach().clone()

    def merged(self, adapter: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """(weight name, merged weight) for each adapted weight, from the (name, tensor) pairs of one push."""
        tensors = dict(adapter)
        for weight, w0 in self.base.items():
            module = PREFIX + weight.removesuffix(".weight")
            a, b = tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"]
            delta = (b.to(w0.device) @ a.to(w0.device)) * self.lora.scaling  # float32, as the trainer's adapters
            yield weight, (w0.float() + delta).to(w0.dtype)  # peft: weight.data += delta (in float32, rounded once)


# --- adapter directories ------------------------------------------------------------------------------------------
def is_adapter_dir(path: str | Path | None) -> bool:
    return bool(path) and (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str | None:
    """The base an adapter directory was trained on (a local directory or a Hub id), None for a freshly initialised
    one (the tiny model's seed)."""
    return json.loads((Path(path).expanduser() / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")


def merge_adapter(model: torch.nn.Module, adapter: str) -> torch.nn.Module:
    """`model` with the adapter directory's weights merged in (peft's merge_and_unload): a plain model again."""
    peft = require_peft()
    return peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
