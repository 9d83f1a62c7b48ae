"""Schema of the `reward` config group: which reward functions score a completion, and their weights.

    reward:
      name: math_thinking
      functions:                       # name → {_target_, weight, **constructor kwargs}
        correct:  {_target_: forge_exp.rewards.math.MathReward, weight: 1.0}
        thinking: {_target_: forge_exp.rewards.thinking.ThinkingReward, weight: 0.1}
      failure_value: 0.0               # score of a function that raised or returned NaN/inf for a completion

Built with `forge_exp.rewards.build_reward(cfg.functions, cfg.failure_value)`, which also imports each `_target_`
and checks its keyword arguments; `__post_init__` here checks the structure only (no imports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict

from forge_exp.rewards.combine import check_spec


@dataclass
class RewardConfig:
    name: str = ""
    # Empty by default, not a default reward: Hydra merges a YAML's dict *into* the schema's, so a default entry
    # would join every reward config. build_reward refuses an empty one.
    functions: Dict[str, Any] = field(default_factory=dict)
    failure_value: float = 0.0

    def __post_init__(self) -> None:
        weights = [check_spec(name, spec)[1] for name, spec in self.functions.items()]
        if weights and all(w == 0 for w in weights):
            raise ValueError("reward.functions: every weight is 0, so every completion would score 0 and there "
                             "would be nothing to learn; give one function a non-zero weight")
        if not math.isfinite(self.failure_value):
            raise ValueError(f"reward.failure_value must be finite, got {self.failure_value}")
