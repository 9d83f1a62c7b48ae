"""Short names on the command line: `algorithm.<knob>` for a knob of the loss is `algorithm.loss.<knob>`.

    forge-exp -m algorithm.beta=0,0.04 algorithm.clip_high=0.2,0.28
      is  forge-exp -m algorithm.loss.beta=0,0.04 algorithm.loss.clip_high=0.2,0.28

The knob has one home, the loss node (its schema: rl/loss_options.py); the alias is another name for the same key,
expanded before Hydra composes, so the composed config, the MLflow params and the sweep's overrides all carry the
full key. Only names that are a field of some loss schema and not of the algorithm schemas are aliases.

Keys under an open map (OPEN_MAPS: a task's own options, whose names the task defines) may be new: they are set
with Hydra's `++` (add or override), so `dataset.task_options.chain_sum.max_terms=3` needs no `+`; the task checks
them before any process starts.
"""

from __future__ import annotations

import dataclasses
import re

from forge_exp.config.algorithm import ALGORITHM_SCHEMAS, LOSS_SCHEMAS


def _fields(schemas) -> set[str]:
    return {f.name for s in schemas.values() for f in dataclasses.fields(s) if not f.name.startswith("_")}


LOSS_KNOBS = frozenset(_fields(LOSS_SCHEMAS))
ALGORITHM_KNOBS = frozenset(_fields(ALGORITHM_SCHEMAS))
ALIASES = {f"algorithm.{k}": f"algorithm.loss.{k}" for k in sorted(LOSS_KNOBS - ALGORITHM_KNOBS)}
OPEN_MAPS = ("dataset.task_options.",)
_OVERRIDE = re.compile(r"^(?P<prefix>[+~]{0,2})(?P<key>algorithm\.[A-Za-z_]\w*)(?P<rest>(=.*)?)$", re.S)


def expand(overrides: list[str]) -> list[str]:
    """The overrides with every alias key written out in full (other arguments unchanged)."""
    out = []
    for arg in overrides:
        if arg.startswith("+mode="):  # the spelling from before `mode` was in the defaults list
            arg = arg[1:]
        m = _OVERRIDE.match(arg)
        if m and m["key"] in ALIASES:
            arg = f"{m['prefix']}{ALIASES[m['key']]}{m['rest']}"
        elif arg.startswith(OPEN_MAPS) and "=" in arg:
            arg = f"++{arg}"
        out.append(arg)
    return out


def short(key: str) -> str:
    """The alias of a full key, if it has one (algorithm.loss.beta → algorithm.beta)."""
    for alias, full in ALIASES.items():
        if full == key:
            return alias
    return key
