"""A weighted sum of reward functions, built from config, that survives a reward function failing.

A reward function is anything callable as `fn(prompt: str, response: str, target: str) -> float` (torchforge's
protocol), so a user class plugs in unchanged through `_target_`:

    reward:
      functions:
        correct:  {_target_: forge_exp.rewards.math.MathReward, weight: 1.0, rel_tol: 1.0e-4}
        mine:     {_target_: my_pkg.rewards.LengthPenalty, weight: -0.1, max_len: 512}

A function that needs more than the target (a task's own verifier, which reads the problem's metadata) takes a
`problem` keyword as well and receives the whole rl.types.Problem (rewards/reasoning_gym.py):
`fn(prompt, response, target, *, problem) -> float`.

A function that raises, or returns NaN, inf or a non-number, scores `failure_value` for that completion only; the
failure is counted in the components (`failed/<name>` = 1.0) and logged once per function, and the run goes on.
The config's functions are built (imported, their arguments checked) by forge_exp.runtime.build.build_reward.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # keeps `import forge_exp.rewards` free of torch
    from forge_exp.rl.types import Problem

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str, str], float]


class WeightedReward:
    """`reward(prompt, response, target) -> (total, components)`: total = Σ weight · value; components holds each
    function's unweighted value under its name and `failed/<name>` (0.0 or 1.0)."""

    def __init__(self, functions: Mapping[str, tuple[RewardFn, float]], failure_value: float = 0.0):
        for name, (fn, _) in functions.items():
            if not callable(fn):
                raise ValueError(f"reward.functions.{name}: {fn!r} is not callable")
        self.functions = {name: (fn, float(weight)) for name, (fn, weight) in functions.items()}
        self.wants_problem = {name for name, (fn, _) in self.functions.items() if takes_problem(fn)}
        self.failure_value = float(failure_value)
        self.failure_counts = {name: 0 for name in self.functions}
        self.last_errors: dict[str, str] = {}  # name → the function's latest failure, "TypeError: ..."

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def __call__(self, prompt: str, response: str, target: str,
                 problem: Problem | None = None) -> tuple[float, dict[str, float]]:
        total, components = 0.0, {}
        for name, (fn, weight) in self.functions.items():
            extra = {"problem": problem} if name in self.wants_problem else {}
            value = self._score_one(name, fn, prompt, response, target, extra)
            failed = value is None
            value = self.failure_value if failed else value
            components[name] = value
            components[f"failed/{name}"] = float(failed)
            total += weight * value
        return total, components

    def _score_one(self, name: str, fn: RewardFn, prompt: str, response: str, target: str,
                   extra: dict[str, Any]) -> float | None:
        try:
            value = fn(prompt, response, target, **extra)
            value = float(value)  # bools, ints, numpy and 0-d torch scalars all convert
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as err:  # noqa: BLE001 — one bad completion must not stop the run
            self.failure_counts[name] += 1
            self.last_errors[name] = f"{type(err).__name__}: {err}".splitlines()[0][:500]
            if self.failure_counts[name] == 1:  # once per function; later ones only counted
                log.warning(
                    "reward function %r failed (scored %s; further failures are counted in failed/%s): %s",
                    name, self.failure_value, name, err, exc_info=not isinstance(err, ValueError),
                )
            return None


def takes_problem(fn: Callable) -> bool:
    """Whether `fn` (a function, or an object's __call__) has a `problem` parameter."""
    try:
        return "problem" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def score_group(
    reward: WeightedReward, problem: Problem, responses: Sequence[str]
) -> tuple[list[float], list[dict[str, float]], int]:
    """Score every response to one problem: (totals, components per response, completions with any failure).
    What the reward worker actor calls for a Group."""
    totals, components, failures = [], [], 0
    for response in responses:
        total, parts = reward(problem.prompt, response, problem.target, problem)
        totals.append(total)
        components.append(parts)
        failures += any(parts[f"failed/{name}"] for name in reward.names)
    return totals, components, failures


def component_means(groups: Sequence[Any]) -> dict[str, float]:
    """The mean of each reward component over every completion of `groups` (scored Groups; a component a
    completion lacks counts as 0)."""
    comps = [comp for g in groups for comp in g.components]
    names = sorted({k for comp in comps for k in comp})
    return {k: sum(comp.get(k, 0.0) for comp in comps) / len(comps) for k in names} if comps else {}
