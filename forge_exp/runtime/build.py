"""Configured components, built: every node with a `_target_` becomes its object through
`hydra.utils.instantiate`, with errors that name the config key.

    build(config.model, "model")                                → forge_exp.models.tiny.TinyQwen3(...)
    build(config.algorithm.loss, "algorithm.loss")              → forge_exp.rl.losses.GRPOLoss(...)
    build(config.generator, "generator", model=..., device=...) → a generation engine
    build_reward(config.reward)                                 → rewards.combine.WeightedReward

A target receives the node's fields that its signature takes, plus the keyword arguments the caller adds. A schema
field the target does not take is left out: it is read elsewhere (`name`, `dataset.max_new_tokens`), or it is a
knob of the component a swapped-in `_target_` replaced (a torchforge-style loss with no constructor arguments
plugs in as `algorithm.loss._target_=my.Loss`). Any other key the target does not take is an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import sys
from collections.abc import Mapping
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from forge_exp.config.enums import plain


def fields_of(node: Any) -> tuple[dict[str, Any], set[str]]:
    """(the node's values as plain Python, the names its schema declares) for a typed config or a mapping."""
    if dataclasses.is_dataclass(node):
        values = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
        return {k: _plain(v) for k, v in values.items()}, set(values)
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    if isinstance(node, Mapping):
        return {k: _plain(v) for k, v in node.items()}, set()
    raise ValueError(f"expected a config node with _target_, got {type(node).__name__}")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in fields_of(value)[0].items()}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return plain(value)


def locate(target: Any, key: str) -> Any:
    if not isinstance(target, str) or not target:
        raise ValueError(f"{key}._target_ must be the dotted path of a class or function, got {target!r}")
    hydra_log = logging.getLogger("hydra.utils")
    level = hydra_log.level
    hydra_log.setLevel(logging.CRITICAL)  # it logs the failure at ERROR before raising it: we say it once, below
    try:
        obj = get_object(target)
    except Exception as e:  # noqa: BLE001 — ImportError, AttributeError, or the module's own import error
        why = " ".join(line.strip() for line in str(e).splitlines()[1:] if line.strip()) or str(e)
        raise ValueError(f"{key}._target_: cannot import {target!r} ({why}); give a full dotted path, e.g. "
                         f"forge_exp.rl.losses.GRPOLoss") from None
    finally:
        hydra_log.setLevel(level)
    if not callable(obj):
        raise ValueError(f"{key}._target_: {target!r} is a {type(obj).__name__}, not a class or function")
    return obj


def accepted_parameters(obj: Any) -> tuple[dict[str, inspect.Parameter], bool]:
    """(named parameters, takes **kwargs) of a class's constructor or a function. A class that parses its keyword
    arguments into its own knobs dataclass (`schema`: the generators, the policy losses) takes that dataclass's
    fields."""
    schema = getattr(obj, "schema", None) if inspect.isclass(obj) else None
    if dataclasses.is_dataclass(schema):
        return {f.name: inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None)
                for f in dataclasses.fields(schema) if f.name != "_target_"}, False
    torch = sys.modules.get("torch")  # a process that never imported torch (a reward worker) has no nn.Module

    if (torch is not None and inspect.isclass(obj) and issubclass(obj, torch.nn.Module)
            and obj.__init__ is torch.nn.Module.__init__):
        return {}, False  # nn.Module's own __init__(*args, **kwargs) accepts nothing in practice
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return {}, True  # no signature to read: let the call itself complain
    named = {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params.values())


def build(node: Any, key: str, *, partial: bool = False, **extra: Any) -> Any:
    """Instantiate the node's `_target_` (see the module docstring). partial=True binds the arguments and returns
    a functools.partial (a function used as a component, e.g. a reward function)."""
    if node is None:
        raise ValueError(f"{key} is null; it must be a config node with _target_")
    values, schema = fields_of(node)
    target = values.pop("_target_", None)
    obj = locate(target, key)
    params, var_kw = accepted_parameters(obj)
    kwargs = {}
    for name, value in values.items():
        if var_kw or name in params:
            kwargs[name] = value
        elif name not in schema:
            close = difflib.get_close_matches(name, list(params), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{key}.{name}: {target} takes no argument {name!r}{hint}; it takes: "
                             f"{', '.join(params) or 'no arguments'}")
    given = set(kwargs) | set(extra)
    if not partial:
        missing = [n for n, p in params.items() if p.default is p.empty and n not in given]
        if missing:
            raise ValueError(f"{key}: {target} needs {', '.join(missing)}; add it under {key}")
    try:  # the config's arguments through Hydra; the caller's objects (models, devices) passed as they are
        factory = instantiate({"_target_": target, **kwargs}, _partial_=True, _convert_="all")
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise ValueError(f"{key} ({target}): {cause}") from None
    if partial:
        return factory
    try:
        return factory(**extra)
    except ValueError as e:  # the component's own check of its arguments: name the key (the traceback stays)
        message = str(e)
        first = message.split(maxsplit=1)[0] if message else ""
        raise ValueError(f"{key}.{message}" if first in kwargs else f"{key}: {message}") from e
    except Exception as e:  # noqa: BLE001 — its constructor failed otherwise: name the key (the traceback stays)
        line = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"{key} ({target}) raised {type(e).__name__}{': ' + line if line else ''}") from e


def build_reward(reward: Any):
    """The weighted reward of `reward.functions` ({name: {_target_, weight, **kwargs}}): classes are
    instantiated, functions are bound to their keyword arguments; each must be callable as
    fn(prompt, response, target) -> float (and may take a `problem` keyword: rewards/combine.py)."""
    from forge_exp.rewards.combine import WeightedReward, takes_problem

    functions = {}
    for name, spec in reward.functions.items():
        where = f"reward.functions.{name}"
        spec = dict(fields_of(spec)[0])
        weight = spec.pop("weight", 1.0)
        is_function = not inspect.isclass(locate(spec.get("_target_"), where))  # a function, a builtin, ...
        fn = build(spec, where, partial=is_function)
        try:
            inspect.signature(fn).bind("", "", "", **({"problem": None} if takes_problem(fn) else {}))
        except TypeError:
            raise ValueError(f"{where}._target_: {spec['_target_']} is not a reward function: it must be callable "
                             "as fn(prompt, response, target[, problem=...]) -> float") from None
        except ValueError:  # no signature to read
            pass
        functions[name] = (fn, weight)
    return WeightedReward(functions, failure_value=reward.failure_value)
