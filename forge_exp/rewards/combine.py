"""A weighted sum of reward functions, built from config, that survives a reward function failing.

A reward function is anything callable as `fn(prompt: str, response: str, target: str) -> float` (torchforge's
protocol), so a user class plugs in unchanged through `_target_`:

    reward:
      functions:
        correct:  {_target_: forge_exp.rewards.math.MathReward, weight: 1.0, rel_tol: 1.0e-4}
        mine:     {_target_: my_pkg.rewards.LengthPenalty, weight: -0.1, max_len: 512}

A function that raises, or returns NaN, inf or a non-number, scores `failure_value` for that completion only; the
failure is counted in the components (`failed/<name>` = 1.0) and logged once per function, and the run goes on.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # keeps `import forge_exp.rewards` free of torch
    from forge_exp.rl.types import Problem

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str, str], float]

# `_target_: math` is short for the built-in class.
SHORT_NAMES = {
    "math": "forge_exp.rewards.math.MathReward",
    "thinking": "forge_exp.rewards.thinking.ThinkingReward",
    "format": "forge_exp.rewards.format.FormatReward",
}


class WeightedReward:
    """`reward(prompt, response, target) -> (total, components)`: total = Σ weight · value; components holds each
    function's unweighted value under its name and `failed/<name>` (0.0 or 1.0)."""

    def __init__(self, functions: Mapping[str, tuple[RewardFn, float]], failure_value: float = 0.0):
        if not functions:
            raise ValueError("reward.functions is empty: give at least one reward function")
        if not math.isfinite(failure_value):
            raise ValueError(f"reward.failure_value must be finite, got {failure_value}")
        for name, (fn, weight) in functions.items():
            _check_name(name)
            if not callable(fn):
                raise ValueError(f"reward.functions.{name}: {fn!r} is not callable")
            _check_weight(name, weight)
        self.functions = {name: (fn, float(weight)) for name, (fn, weight) in functions.items()}
        self.failure_value = float(failure_value)
        self.failure_counts = {name: 0 for name in self.functions}

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def __call__(self, prompt: str, response: str, target: str) -> tuple[float, dict[str, float]]:
        total, components = 0.0, {}
        for name, (fn, weight) in self.functions.items():
            value = self._score_one(name, fn, prompt, response, target)
            failed = value is None
            value = self.failure_value if failed else value
            components[name] = value
            components[f"failed/{name}"] = float(failed)
            total += weight * value
        return total, components

    def _score_one(self, name: str, fn: RewardFn, prompt: str, response: str, target: str) -> float | None:
        try:
            value = fn(prompt, response, target)
            value = float(value)  # bools, ints, numpy and 0-d torch scalars all convert
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as err:  # noqa: BLE001 — one bad completion must not stop the run
            self.failure_counts[name] += 1
            if self.failure_counts[name] == 1:  # once per function; later ones only counted
                log.warning(
                    "reward function %r failed (scored %s; further failures are counted in failed/%s): %s",
                    name, self.failure_value, name, err, exc_info=not isinstance(err, ValueError),
                )
            return None


def score_group(
    reward: WeightedReward, problem: Problem, responses: Sequence[str]
) -> tuple[list[float], list[dict[str, float]], int]:
    """Score every response to one problem: (totals, components per response, completions with any failure).
    What the reward worker actor calls for a Group."""
    totals, components, failures = [], [], 0
    for response in responses:
        total, parts = reward(problem.prompt, response, problem.target)
        totals.append(total)
        components.append(parts)
        failures += any(parts[f"failed/{name}"] for name in reward.names)
    return totals, components, failures


def build_reward(functions: Mapping[str, Mapping[str, Any]], failure_value: float = 0.0) -> WeightedReward:
    """Build a `WeightedReward` from `{name: {_target_: dotted.path | short name, weight: float, **kwargs}}`.

    A class target is instantiated with the kwargs; a function target is used as the reward itself, with the
    kwargs bound by keyword. `weight` defaults to 1.0. Every mistake is a ValueError naming the config key.
    """
    if not functions:
        raise ValueError("reward.functions is empty: give at least one reward function")
    built = {}
    for name, spec in functions.items():
        target, weight, kwargs = check_spec(name, spec)
        built[name] = (_instantiate(name, target, kwargs), weight)
    return WeightedReward(built, failure_value=failure_value)


def check_spec(name: str, spec: Any) -> tuple[str, float, dict[str, Any]]:
    """Structural check of one `reward.functions.<name>` entry (no import): (target, weight, kwargs)."""
    _check_name(name)
    where = f"reward.functions.{name}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping like {{_target_: forge_exp.rewards.math.MathReward, "
                         f"weight: 1.0}}, got {spec!r}")
    kwargs = dict(spec.items())
    target = kwargs.pop("_target_", None)
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"{where}._target_ is missing: set it to the dotted path of a reward class or function "
                         f"(e.g. forge_exp.rewards.math.MathReward) or one of {sorted(SHORT_NAMES)}")
    weight = kwargs.pop("weight", 1.0)
    _check_weight(name, weight)
    return target.strip(), float(weight), kwargs


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or any(c in name for c in "/. "):
        raise ValueError(f"reward.functions: name {name!r} must be a non-empty string without '/', '.' or spaces "
                         f"(it becomes a metric key)")


def _check_weight(name: str, weight: Any) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"reward.functions.{name}.weight must be a finite number, got {weight!r}")


def _locate(name: str, target: str) -> Any:
    path = SHORT_NAMES.get(target, target)
    parts = path.split(".")
    error: Exception | None = None
    for split in range(len(parts) - 1, 0, -1):  # longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as err:
            error = error or err
            continue
        except Exception as err:  # the module exists but fails to import: show why
            raise ValueError(f"reward.functions.{name}._target_: importing {path!r} raised {err!r}") from err
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
            return obj
        except AttributeError as err:
            error = err
            break
    raise ValueError(
        f"reward.functions.{name}._target_: cannot import {target!r} ({error or 'not a dotted path'}). Give the "
        f"dotted path of a class or function, e.g. forge_exp.rewards.math.MathReward, or one of {sorted(SHORT_NAMES)}"
    )


def _instantiate(name: str, target: str, kwargs: dict[str, Any]) -> RewardFn:
    where = f"reward.functions.{name}"
    obj = _locate(name, target)
    target = SHORT_NAMES.get(target, target)
    if not callable(obj):
        raise ValueError(f"{where}._target_: {target} is a {type(obj).__name__}, not a class or function")
    is_class = inspect.isclass(obj)
    _check_kwargs(where, target, obj, kwargs, skip=0 if is_class else 3)
    if is_class:
        try:
            fn = obj(**kwargs)
        except (TypeError, ValueError) as err:  # the class's own argument checks
            message = str(err)
            first = message.split(maxsplit=1)[0] if message else ""
            raise ValueError((f"{where}." if first in kwargs else f"{where}: ") + message) from err
    else:
        fn = functools.partial(obj, **kwargs) if kwargs else obj
    if not _accepts_three(fn):
        raise ValueError(f"{where}._target_: {target} is not a reward function: it must be callable as "
                         f"fn(prompt, response, target) -> float")
    return fn


def _check_kwargs(where: str, target: str, obj: Any, kwargs: dict[str, Any], skip: int) -> None:
    try:
        params = list(inspect.signature(obj).parameters.values())[skip:]
    except (TypeError, ValueError):  # builtins without a signature: let the call itself complain
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}.{key}: {target} takes no argument {key!r}{hint}; it accepts: "
                             f"{', '.join(accepted) or 'no arguments'}")
    missing = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL
               and p.name not in kwargs]
    if missing:
        raise ValueError(f"{where}: {target} needs {', '.join(missing)}; add them under {where}")


def _accepts_three(fn: Any) -> bool:
    try:
        inspect.signature(fn).bind("", "", "")
    except TypeError:
        return False
    except ValueError:  # no signature available
        return True
    return True
