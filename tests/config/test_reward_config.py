"""RewardConfig: structure errors name `reward.functions.<name>...`; every conf/reward YAML fits the schema."""

import pytest
from omegaconf import OmegaConf

from forge_exp.config.reward import RewardConfig
from forge_exp.rewards import build_reward
from tests.conftest import CONF


def typed(path) -> RewardConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RewardConfig), OmegaConf.load(path)))


@pytest.mark.parametrize("path", sorted((CONF / "reward").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_reward_yaml_fits_the_schema(path):
    cfg = typed(path)
    assert cfg.name == path.stem and cfg.functions
    reward = build_reward(cfg.functions, cfg.failure_value)  # imports every _target_, checks every kwarg
    if path.stem != "arithmetic":  # the math-style rewards all give full marks to a well-formed right answer
        total, parts = reward("Q", "<think>6 times 7</think><answer>42</answer>", "42")
        assert total == pytest.approx(sum(w for _, w in reward.functions.values()))
        assert set(parts) == {*reward.names, *(f"failed/{n}" for n in reward.names)}


@pytest.mark.parametrize(
    ("functions", "message"),
    [
        ({"correct": {"weight": 1.0}}, r"reward\.functions\.correct\._target_ is missing"),
        ({"correct": {"_target_": "math", "weight": float("nan")}}, r"reward\.functions\.correct\.weight"),
        ({"correct": {"_target_": "math", "weight": "1"}}, r"reward\.functions\.correct\.weight"),
        ({"correct": "math"}, r"reward\.functions\.correct must be a mapping"),
        ({"a": {"_target_": "math", "weight": 0}, "b": {"_target_": "format", "weight": 0.0}}, "every weight is 0"),
    ],
)
def test_structure_errors_name_the_key(functions, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(name="x", functions=functions)


def test_failure_value_must_be_finite_and_empty_default_is_refused_at_build():
    with pytest.raises(ValueError, match="reward.failure_value"):
        RewardConfig(name="x", functions={"c": {"_target_": "math"}}, failure_value=float("inf"))
    with pytest.raises(ValueError, match="reward.functions is empty"):
        build_reward(RewardConfig().functions)


def test_an_unknown_top_level_key_fails_in_the_schema():
    with pytest.raises(Exception, match="functons"):
        OmegaConf.merge(OmegaConf.structured(RewardConfig), {"functons": {}})
