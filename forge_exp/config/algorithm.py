"""Schema of the `algorithm` config group (conf/algorithm/*.yaml) and `build_loss`, which turns its `loss` node
into a loss module.

Each YAML sets the fields below; its `loss` node names the loss class with `_target_` and passes it the top-level
knobs by interpolation (`clip_high: ${algorithm.clip_high}`), so `algorithm.clip_high=0.28` reaches the loss and
`algorithm.loss._target_=my_losses.MyLoss` swaps the class. docs/algorithms.md describes every algorithm.
No hydra import here: the lead's config/store.py registers the schema.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean", "fixed_horizon")
ADVANTAGES = ("group_norm", "mean", "loo")


@dataclass
class AlgorithmConfig:
    """Defaults are GRPO's (DeepSeekMath, arXiv 2402.03300) except group_size / prompts_per_step, sized for a
    single node."""

    name: str = "grpo"
    # --- batch: prompts_per_step groups of group_size completions per optimizer step
    group_size: int = 8
    prompts_per_step: int = 16
    # --- optimizer
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per step
    # --- loss knobs, passed to `loss` by interpolation
    beta: float = 0.04  # KL(π_θ ‖ π_ref) coefficient; 0 = no reference model at all
    kl_estimator: str = "k3"  # k1 | k2 | k3 (Schulman 2020)
    clip_low: Optional[float] = 0.2  # ratio ≥ 1 − clip_low; null = no lower clip (CISPO)
    clip_high: Optional[float] = 0.2  # ratio ≤ 1 + clip_high; null = no upper clip
    dual_clip: Optional[float] = None  # c > 1: for A < 0 bound the objective at c·A (Ye et al. 2020)
    loss_agg: str = "seq_mean"  # token_mean | seq_mean | fixed_horizon (Dr. GRPO)
    entropy_coef: float = 0.0  # entropy bonus; 0 = off
    tau_pos: float = 1.0  # SAPO gate temperature for A > 0
    tau_neg: float = 1.05  # SAPO gate temperature for A ≤ 0
    gspo_token: bool = False  # GSPO-token (per-token advantages) instead of sequence-level GSPO
    ratio_cap: Optional[float] = None  # REINFORCE: truncate the behaviour importance ratio at this; null = none
    max_response_len: int = 512  # fixed_horizon's constant and DAPO's L_max; YAMLs set ${dataset.max_new_tokens}
    # --- advantages (rl/advantages.py)
    advantage: str = "group_norm"  # group_norm | mean | loo
    advantage_eps: float = 1e-6  # group_norm: (r − mean) / (std + eps)
    # --- group filters (rl/filters.py, DAPO)
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, refill
    max_sampling_attempts: int = 3  # generation rounds per batch before training on what is there
    overlong_filter: bool = False  # truncated completions get no loss
    overlong_penalty: bool = False  # soft overlong punishment added to the reward
    overlong_buffer: Optional[int] = None  # L_cache in tokens; null = max_response_len // 5 (the paper's 4096 of
    # 20480). Read it through `overlong_buffer_len`.
    # --- sampling of training rollouts
    temperature: float = 1.0
    top_p: float = 1.0
    max_policy_age: int = 1  # rollouts may be this many weight versions behind the trainer; 0 = on-policy
    # --- SFT (algorithm=sft: apps/sft.py, data/sft.py; the GRPO family ignores these)
    batch_size: int = 8  # rows per optimizer step
    max_seq_len: int = 2048  # tokens per row; a longer example is cut to it
    packing: bool = True  # several examples per row, each with its own position ids and attention
    warmup_steps: int = 0  # linear lr warm-up, then cosine decay to 10% of lr at the last step
    # --- the loss: {_target_: dotted.path.Class, kwarg: value, ...} (Hydra instantiate style)
    loss: Any = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("algorithm.name must be a non-empty string")
        _at_least("group_size", self.group_size, 2, "advantages are relative within a group")
        _at_least("prompts_per_step", self.prompts_per_step, 1)
        _at_least("grad_accum", self.grad_accum, 1)
        _at_least("max_response_len", self.max_response_len, 1, "the YAMLs set it to dataset.max_new_tokens")
        _at_least("max_sampling_attempts", self.max_sampling_attempts, 1)
        _at_least("max_policy_age", self.max_policy_age, 0)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("max_seq_len", self.max_seq_len, 2, "a target token needs one token before it")
        _at_least("warmup_steps", self.warmup_steps, 0)
        _positive("lr", self.lr)
        _positive("max_grad_norm", self.max_grad_norm)
        _positive("advantage_eps", self.advantage_eps)
        _positive("tau_pos", self.tau_pos)
        _positive("tau_neg", self.tau_neg)
        _positive("temperature", self.temperature, "0 is greedy decoding, which gives a group identical completions")
        if not self.weight_decay >= 0:
            raise ValueError(f"algorithm.weight_decay must be >= 0, got {self.weight_decay}")
        if not self.beta >= 0:
            raise ValueError(f"algorithm.beta must be >= 0, got {self.beta}")
        if not math.isfinite(self.entropy_coef):
            raise ValueError(f"algorithm.entropy_coef must be finite, got {self.entropy_coef}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"algorithm.top_p must be in (0, 1], got {self.top_p}")
        if self.clip_low is not None and not 0 <= self.clip_low < 1:
            raise ValueError(f"algorithm.clip_low must be in [0, 1) or null, got {self.clip_low}")
        if self.clip_high is not None and not self.clip_high >= 0:
            raise ValueError(f"algorithm.clip_high must be >= 0 or null, got {self.clip_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"algorithm.dual_clip must be > 1 or null, got {self.dual_clip}")
        if self.ratio_cap is not None and not self.ratio_cap > 0:
            raise ValueError(f"algorithm.ratio_cap must be > 0 or null, got {self.ratio_cap}")
        _one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _one_of("loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        _one_of("advantage", self.advantage, ADVANTAGES)
        if self.overlong_buffer is not None and not 1 <= self.overlong_buffer <= self.max_response_len:
            raise ValueError(
                f"algorithm.overlong_buffer must be in [1, algorithm.max_response_len={self.max_response_len}] "
                f"or null, got {self.overlong_buffer}"
            )
        has_target = isinstance(self.loss, Mapping) and isinstance(self.loss.get("_target_"), str)
        if self.loss is not None and not has_target:
            raise ValueError(
                "algorithm.loss must be a mapping with _target_ (the dotted path of a loss class), "
                f"e.g. {{_target_: forge_exp.rl.losses.GRPOLoss}}, got {self.loss!r}"
            )


    @property
    def overlong_buffer_len(self) -> int:
        """L_cache of DAPO's soft overlong punishment, in tokens."""
        return self.overlong_buffer if self.overlong_buffer is not None else max(1, self.max_response_len // 5)


def _at_least(key: str, value: int, low: int, why: str = "") -> None:
    if value < low:
        raise ValueError(f"algorithm.{key} must be >= {low}{f' ({why})' if why else ''}, got {value}")


def _positive(key: str, value: float, why: str = "") -> None:
    if not value > 0:
        raise ValueError(f"algorithm.{key} must be > 0{f' ({why})' if why else ''}, got {value}")


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"algorithm.{key} must be one of {', '.join(allowed)}, got {value!r}")


# ---------------------------------------------------------------------------------------------- build_loss
def _locate(path: str) -> Any:
    """Import `a.b.C` (or `a.b.C.attr`): the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            # only "this prefix does not exist" means try a shorter one; a failing import inside it is real
            if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue
            raise
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"no module named {parts[0]!r}")


# Knobs the algorithm YAMLs route from `algorithm.*` into their loss node. A loss swapped in with
# `algorithm.loss._target_=my.Loss` receives those it declares and is not handed the rest: a torchforge-style
# `forward(logprobs, ref_logprobs, advantages, padding_mask)` loss with no constructor arguments plugs in unchanged.
# Any other keyword it does not take is still an error (a typo, or a `+algorithm.loss.<kw>` meant for it).
ROUTED_KNOBS = frozenset({
    "clip_low", "clip_high", "dual_clip", "beta", "kl_estimator", "entropy_coef", "loss_agg", "horizon",
    "token_level", "tau_pos", "tau_neg", "ratio_cap",
})


def build_loss(loss_node: Mapping[str, Any] | None) -> Any:
    """Construct the loss named by `loss_node['_target_']` with the node's other keys as keyword arguments.

    A class is instantiated; a function is called as a factory, or, with `_partial_: true`, bound to the
    keywords and returned as the loss itself. Errors name the config key: `algorithm.loss._target_` when the
    import fails, `algorithm.loss.<kw>` when the constructor does not take a keyword.
    """
    if loss_node is None:
        raise ValueError(
            "algorithm.loss is not set: choose an algorithm (algorithm=grpo) or set algorithm.loss._target_"
        )
    if not isinstance(loss_node, Mapping):  # a DictConfig from Hydra before to_object
        from omegaconf import OmegaConf

        loss_node = OmegaConf.to_container(loss_node, resolve=True)
    node = dict(loss_node)
    target = node.pop("_target_", None)
    partial = bool(node.pop("_partial_", False))
    if not isinstance(target, str) or not target:
        raise ValueError(f"algorithm.loss._target_ must be the dotted path of a loss class, got {target!r}")
    unsupported = sorted(k for k in node if k.startswith("_"))
    if unsupported:
        raise ValueError(f"algorithm.loss.{unsupported[0]} is not supported (only _target_ and _partial_)")
    try:
        obj = _locate(target)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"algorithm.loss._target_: cannot import {target!r} ({e}); give a full dotted path, "
            "e.g. forge_exp.rl.losses.GRPOLoss"
        ) from None
    if not callable(obj):
        raise ValueError(f"algorithm.loss._target_: {target!r} is not a class or function")

    try:
        params = dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        params = None
    if inspect.isclass(obj) and _inherits_module_init(obj):
        params = {}  # nn.Module's own __init__(*args, **kwargs) accepts nothing in practice
    if params is not None and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        node = {k: v for k, v in node.items() if k in params or k not in ROUTED_KNOBS}
        rejected = sorted(k for k in node if k not in params)
        if rejected:
            accepted = ", ".join(p for p in params if params[p].kind is not inspect.Parameter.VAR_POSITIONAL)
            raise ValueError(
                f"algorithm.loss.{rejected[0]}: {target} does not take {', '.join(rejected)} "
                f"(it takes: {accepted or 'nothing'}); drop them with "
                + " ".join(f"~algorithm.loss.{k}" for k in rejected)
                + " or give the class a **kwargs parameter"
            )
        if not partial:
            missing = [
                n for n, p in params.items()
                if p.default is inspect.Parameter.empty and n not in node
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            ]
            if missing:
                raise ValueError(f"algorithm.loss.{missing[0]} is required by {target}")
    if partial:
        import functools

        return functools.partial(obj, **node)
    try:
        return obj(**node)
    except (ValueError, TypeError) as e:
        raise ValueError(f"algorithm.loss ({target}): {e}") from None


def _inherits_module_init(cls: type) -> bool:
    import torch

    return issubclass(cls, torch.nn.Module) and cls.__init__ is torch.nn.Module.__init__
