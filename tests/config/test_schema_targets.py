"""A schema and the component its `_target_` builds cannot drift apart: for every registered schema with a
`_target_`, the target either parses its keyword arguments into that very dataclass (`schema`: the generators, the
policy losses; one list of knobs, nothing to compare), or its constructor takes the schema's fields by name: a
default stated in both places is the same value, and what it requires is a field or something the caller passes.
Where the target consumes the whole node (model, loss, generator, trainer), a field it does not take is one the
config reads elsewhere (READ_ELSEWHERE), never a knob that silently goes nowhere; a dataset's or an environment's
node also holds what the loop and the env service read (the response budget, the turn limits)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from enum import Enum

import pytest

from forge_exp.config.store import SCHEMAS

# fields a schema holds that its target does not take: who reads them instead
READ_ELSEWHERE = {
    "name": "the config and the CLI (which option this is)",
    "warmstart": "apps: the supervised warm start before RL (apps/common.py)",
    "hosts_reference": "apps: which service answers for the reference model (apps/common.py ReferencePlan)",
}
# constructor parameters the caller passes beside the node (runtime/build.py: build(node, key, **extra))
CALLER_GIVES = {"model", "device", "seed", "loss", "loss_inputs", "init_path", "lr", "weight_decay", "degrees",
                "run_dir"}  # run_dir: the tracker gives a logger the run's output dir (tracking/loggers.py)
WHOLE_NODE = ("model", "loss", "generator", "trainer")


def _registered():
    for group, schemas in SCHEMAS.items():
        for name, schema in schemas.items():
            target = {f.name: f for f in dataclasses.fields(schema)}.get("_target_")
            if target is not None:
                yield pytest.param(group, schema, target.default, id=f"{group}/{name}")


def _target(path: str):
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as e:  # an optional extra (torchtitan, reasoning-gym, openenv, verifiers) not installed
        if (e.name or "").startswith("forge_exp"):
            raise
        pytest.skip(f"{path} needs {e.name}, not installed here")


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return inspect.Parameter.empty
    value = value.value if isinstance(value, Enum) else value
    return list(value) if isinstance(value, tuple) else value  # a tuple default is a list in the YAML


def _defaults(target) -> dict:
    """The target's constructor defaults by parameter name (a dataclass's default factories called)."""
    if dataclasses.is_dataclass(target):
        return {f.name: _default(f) for f in dataclasses.fields(target) if f.init}
    return {n: list(p.default) if isinstance(p.default, tuple) else p.default
            for n, p in inspect.signature(target).parameters.items()}


@pytest.mark.parametrize("group,schema,path", list(_registered()))
def test_the_schema_is_what_its_target_takes(group, schema, path):
    target = _target(path)
    own = getattr(target, "schema", None)
    if own is not None:  # the target parses **knobs into its own dataclass: the registered schema must be it
        assert own is schema, f"{path}.schema is {own.__name__}, but the registered schema is {schema.__name__}"
        return
    fields = {f.name: f for f in dataclasses.fields(schema) if f.name != "_target_"}
    params = {n: p for n, p in inspect.signature(target).parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(target).parameters.values())
    if group in WHOLE_NODE and not takes_any:
        not_taken = sorted(set(fields) - set(params) - set(READ_ELSEWHERE))
        assert not not_taken, f"{schema.__name__} has {not_taken}, which {path} does not take"
    required = {n for n, p in params.items() if p.default is p.empty}
    unknown = sorted(required - set(fields) - CALLER_GIVES)
    assert not unknown, f"{path} requires {unknown}, which {schema.__name__} does not declare"
    defaults = _defaults(target)
    for name in set(params) & set(fields):
        theirs, ours = defaults[name], _default(fields[name])
        if dataclasses.is_dataclass(ours):
            continue  # a nested node (model.lora): the target receives it as a plain dict
        if theirs is not inspect.Parameter.empty:
            assert theirs == ours, (f"{name}: {path} defaults to {theirs!r}, {schema.__name__} to {ours!r}; state "
                                    f"the default once (in the schema) and drop the other")


def test_the_check_catches_a_drifted_default(monkeypatch):
    """The check can fail: a loss whose constructor restates a knob with another default is reported."""
    from forge_exp.rl.loss_options import GRPOOptions

    class Drifted:
        def __init__(self, clip_low=0.2, clip_high=0.3, dual_clip=None, beta=0.04, kl_estimator="k3",
                     entropy_coef=0.0, loss_agg="seq_mean", horizon=None, rollout_correction="none", rollout_cap=None):
            pass

    monkeypatch.setattr("tests.config.test_schema_targets._target", lambda path: Drifted)
    with pytest.raises(AssertionError, match=r"clip_high: .* defaults to 0\.3, GRPOOptions to 0\.2"):
        test_the_schema_is_what_its_target_takes("loss", GRPOOptions, "x.Drifted")
