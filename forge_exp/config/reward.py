"""Schema of the `reward` group: which reward functions score a completion, and their weights.

    reward:
      name: math_thinking
      functions:                       # name → {_target_, weight, **constructor kwargs}
        correct:  {_target_: forge_exp.rewards.math.MathReward, weight: 1.0}
        thinking: {_target_: forge_exp.rewards.thinking.ThinkingReward, weight: 0.1}
      failure_value: 0.0               # score of a function that raised or returned NaN/inf for a completion
      max_failure_rate: 0.5            # the run fails when a function fails on more than this share of a step's
      failure_steps: 3                 #   completions, this many steps in a row (with that function's own error)

Built by runtime.build.build_reward (each `_target_` through hydra.utils.instantiate, its keyword arguments checked
against its signature); the structure is checked here, without imports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict

from forge_exp.checks import FieldError, at_least, finite, within


@dataclass
class RewardConfig:
    name: str = ""
    # Empty by default, not a default reward: Hydra merges a YAML's dict *into* the schema's, so a default entry
    # would join every reward config.
    functions: Dict[str, Any] = field(default_factory=dict)
    failure_value: float = 0.0
    max_failure_rate: float = 0.5  # share of a step's completions a function may fail on; 1 = never stop the run
    failure_steps: int = 3  # steps in a row above max_failure_rate before the run stops as FAILED

    def __post_init__(self) -> None:
        weights = [check_function(name, spec) for name, spec in self.functions.items()]
        if weights and all(w == 0 for w in weights):  # (empty: the schema's default; preflight refuses it)
            raise FieldError("functions", "have every weight 0, so every completion would score 0 and there would "
                                          "be nothing to learn; give one function a non-zero weight")
        finite("failure_value", self.failure_value)
        within("max_failure_rate", self.max_failure_rate, 0, 1)
        at_least("failure_steps", self.failure_steps, 1)


def check_function(name: Any, spec: Any) -> float:
    """Structure of one `reward.functions.<name>` entry; returns its weight."""
    if not isinstance(name, str) or not name or any(c in name for c in "/. "):
        raise FieldError("functions", f"name {name!r} must be a non-empty string without '/', '.' or spaces "
                                      f"(it becomes a metric key)")
    if not isinstance(spec, Mapping):
        raise FieldError(f"functions.{name}", f"must be a mapping like {{_target_: forge_exp.rewards.math.MathReward,"
                                              f" weight: 1.0}}, got {spec!r}")
    target = spec.get("_target_")
    if not isinstance(target, str) or not target.strip():
        raise FieldError(f"functions.{name}._target_", "is missing: set it to the dotted path of a reward class or "
                                                       "function (e.g. forge_exp.rewards.math.MathReward)")
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise FieldError(f"functions.{name}.weight", f"must be a finite number, got {weight!r}")
    return float(weight)
