"""From the composed config to the typed one, or one line saying what is wrong and where.

    validate(cfg)         every group node is typed by a schema, no key is unknown (a `+key` the schema lacks is
                          an error, with the closest valid key), then the schemas' range checks (to_object)
    suggest(key, cfg)     "did you mean ..." for a key that is not in the config

Checks that need more than the config (the loss and rewards import, the weights exist, the data opens, the GPUs
exist) are apps/preflight.py's.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from forge_exp.config.aliases import ALIASES, short
from forge_exp.checks import FieldError
from forge_exp.config.run import ForgeConfig
from forge_exp.config.store import SCHEMAS

TYPED_GROUPS = ("model", "algorithm", "dataset", "trainer", "generator", "env", "cluster")
# the root's type of each group that no option is: a node still of that type had no schema named in its YAML
UNCHOSEN = {group: kind for group, kind in typing.get_type_hints(ForgeConfig).items()
            if group in TYPED_GROUPS and kind not in SCHEMAS[group].values()}


class ConfigError(ValueError):
    """A config mistake, in one line naming the key. The CLI prints it and exits 2 before any process starts."""


def validate(cfg: DictConfig) -> ForgeConfig:
    """The typed config, or a ConfigError."""
    for group in TYPED_GROUPS:
        node = cfg.get(group)
        kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if not dataclasses.is_dataclass(kind) or kind is UNCHOSEN.get(group):
            raise ConfigError(no_schema(group))
    for name in cfg.get("logger") or {}:  # logger.<name>, one node per chosen option (config/logger.py)
        if not dataclasses.is_dataclass(OmegaConf.get_type(cfg.logger._get_node(name))):
            raise ConfigError(f"logger.{name} is not a logger; choose among conf/logger/ with e.g. "
                              f"logger=[mlflow,tensorboard,wandb]")
    unknown = next(_unknown_keys(cfg, ""), None)
    if unknown is not None:
        raise ConfigError(f"{unknown} is not a config key{suggest(unknown, cfg)}")
    return _typed(cfg, "")


def no_schema(group: str) -> str:
    return (f"{group}: the chosen option has no schema; its YAML must start with "
            f"`defaults: [/schema/{group}/<kind>@_here_, _self_]` (see conf/{group}/)")


def unknown_to_base(text: str) -> str | None:
    """no_schema's line for Hydra's error about a key that a group node typed only by the root's base lacks (its
    option's YAML names no schema), or None for any other error."""
    m = re.search(r"not in '(\w+)'\s+full_key: (\w+)\.", text)
    base = UNCHOSEN.get(m.group(2)) if m else None
    return no_schema(m.group(2)) if base is not None and base.__name__ == m.group(1) else None


def _typed(node: DictConfig, path: str):
    """to_object, children first, so a failed range check is reported with the path of the node that holds it
    (through plain dicts too: logger.<name>)."""
    for key in node.keys():
        child = node._get_node(key)
        kind = OmegaConf.get_type(child) if isinstance(child, DictConfig) and not child._is_none() else None
        if kind is dict or dataclasses.is_dataclass(kind):
            _typed(child, f"{path}{key}.")
    try:
        return OmegaConf.to_object(node)
    except FieldError as e:
        raise ConfigError(f"{path}{e}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(one_line(e)) from None


def _unknown_keys(node: DictConfig, path: str):
    """Keys of a schema-typed node that its schema does not declare (added with `+key=...`)."""
    schema = OmegaConf.get_type(node)
    names = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        full = f"{path}{key}"
        if names is not None and key not in names:
            yield full
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            yield from _unknown_keys(child, full + ".")


def all_keys(cfg: DictConfig) -> list[str]:
    """Every leaf key of the config (and each alias of one), for suggestions."""
    keys: list[str] = []

    def walk(node: DictConfig, path: str) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and len(child):
                walk(child, f"{path}{key}.")
            else:
                keys.append(f"{path}{key}")
            if OmegaConf.get_type(node) is dict and not dataclasses.is_dataclass(OmegaConf.get_type(child)):
                break  # free-form dicts (reward functions' kwargs): one example is enough; typed ones (logger) all
    walk(cfg, "")
    return keys + [alias for alias, full in ALIASES.items() if full in keys]


def suggest(key: str, cfg: DictConfig | None) -> str:
    """'; did you mean X?' for the valid key closest to `key` ('' when none is close)."""
    if cfg is None:
        return ""
    keys = [k for k in all_keys(cfg) if k != key]
    parent, _, leaf = key.rpartition(".")
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75) or [
        f"{parent}.{m}" if parent else m
        for m in difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in siblings], n=1, cutoff=0.6)
    ]
    if not close:
        return ""
    best = close[0]
    full = ALIASES.get(best, best)
    alias = short(full)
    shown = f"{alias} (= {full})" if alias != full else full
    return f"; did you mean {shown}?"


def one_line(e: Exception) -> str:
    """OmegaConf's error (a wrong type, a bad enum value) as one line with the full key."""
    cause = e.__cause__ or e.__context__
    key = getattr(e, "full_key", None) or getattr(cause, "full_key", None) or ""
    msg = str(cause) if isinstance(cause, (ValueError, OmegaConfBaseException)) else str(e)
    first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
    if key and key not in first:
        first = f"{key}: {first}"
    return first
