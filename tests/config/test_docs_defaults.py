"""docs/algorithms.md states each algorithm's settings (its tables of defaults and its `key: value` notes); they must
be what `algorithm=<name>` composes to, so a default changed in its one home (the schemas) cannot leave the page
behind. Composed with a real model: the tiny model's specialised configs (conf/model_algorithm/) change lr and batch."""

from __future__ import annotations

import re
from enum import Enum

import pytest
import yaml
from omegaconf import OmegaConf

from tests.config.helpers import compose_cfg
from tests.conftest import ROOT

TEXT = (ROOT / "docs" / "algorithms.md").read_text()


def _sections() -> dict[str, str]:
    """The text of each algorithm's section, by the conf/algorithm option it names."""
    out = {}
    for part in re.split(r"^## ", TEXT, flags=re.M):
        m = re.search(r"`conf/algorithm/(\w+)\.yaml`", part)
        if m:
            out[m[1]] = part
    return out


def _stated(section: str) -> list[tuple[str, str]]:
    """(key, value as written) from the section's `| key | default |` table rows and its `key: value` notes."""
    pairs = []
    for keys, values in re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| ([^|]+) \|", section, re.M):
        names = re.findall(r"`(\w+)`", keys)
        written = [v.strip() for v in values.split(" (")[0].split(",")]
        assert len(names) == len(written), (keys, values)
        pairs += zip(names, written)
    pairs += re.findall(r"`(\w+): ([^`]+)`", section)
    return pairs


def _value(algorithm, key: str):
    node = algorithm if hasattr(algorithm, key) else algorithm.loss
    value = getattr(node, key)
    return value.value if isinstance(value, Enum) else value


@pytest.mark.parametrize("name,section", sorted(_sections().items()))
def test_the_page_states_what_the_option_composes_to(name, section):
    algorithm = OmegaConf.to_object(compose_cfg(f"algorithm={name}", "model=qwen3_0_6b")).algorithm
    stated = _stated(section)
    assert stated, f"docs/algorithms.md states no settings for {name}"
    for key, written in stated:
        if key == "horizon" or not (hasattr(algorithm, key) or hasattr(algorithm.loss, key)):
            continue  # not a knob of this algorithm (a reference to another section), or a formula's symbol
        expected = yaml.safe_load(written)
        if isinstance(expected, str) and re.fullmatch(r"[\d.]+e-?\d+", expected):
            expected = float(expected)  # 1e-6: YAML 1.1 reads a float only with a dot
        got = _value(algorithm, key)
        assert got == expected or (isinstance(got, float) and expected == pytest.approx(got)), (
            f"docs/algorithms.md says {name}'s {key} is {written}; algorithm={name} composes {got!r}")
