"""The root config types every group by the base its options' schemas share, and each schema answers what the rest of
the run asks of its group (which app trains, which service scores, the budgets, the warm start), so nothing probes a
node for a key it may lack."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from omegaconf import OmegaConf

from forge_exp.config.dataset import DatasetBase
from forge_exp.config.run import ForgeConfig
from forge_exp.config.store import SCHEMAS
from forge_exp.config.validate import TYPED_GROUPS, ConfigError, unknown_to_base, validate
from tests.config.helpers import compose_cfg, typed


def test_every_group_is_typed_by_a_base_of_its_options():
    hints = typing.get_type_hints(ForgeConfig)
    for group in TYPED_GROUPS:
        assert all(issubclass(schema, hints[group]) for schema in SCHEMAS[group].values()), group
    untyped = sorted(f.name for f in dataclasses.fields(ForgeConfig) if hints[f.name] is typing.Any)
    assert untyped == []


def test_a_group_node_of_the_base_alone_names_the_missing_schema():
    cfg = compose_cfg()
    cfg.dataset = OmegaConf.structured(DatasetBase)  # what an option whose YAML names no schema composes to
    with pytest.raises(ConfigError, match=r"^dataset: the chosen option has no schema; its YAML must start with"):
        validate(cfg)
    hydra_said = ("In 'dataset/mine': ConfigKeyError raised while composing config:\nKey 'digits' not in "
                  "'DatasetBase'\n    full_key: dataset.digits\n    reference_type=DatasetBase")
    assert unknown_to_base(hydra_said).startswith("dataset: the chosen option has no schema")
    assert unknown_to_base(hydra_said.replace("'DatasetBase'", "'ArithmeticDataset'")) is None  # a mistyped key


@pytest.mark.parametrize("overrides, app, sft_inputs", [((), "grpo", False), (("algorithm=dapo",), "grpo", False),
                                                         (("algorithm=sft",), "sft", True)])
def test_the_algorithm_says_which_app_trains_it_and_what_its_loss_takes(overrides, app, sft_inputs):
    a = typed(*overrides).algorithm
    assert a.app == app
    assert ("advantages" in a.loss_inputs) is not sft_inputs and {"logprobs", "padding_mask"} <= a.loss_inputs
    assert ("ref_logprobs" in a.loss_inputs) is a.needs_reference


def test_the_schemas_answer_for_their_group():
    default, tools, slurm = typed(), typed("experiment=tool_arithmetic"), typed("cluster=slurm")
    assert (default.env.scorer, tools.env.scorer) == ("reward", "env")
    assert (default.env.tool_control, tools.env.tool_control) == (False, True)
    assert not typed("experiment=tool_arithmetic", "env.tools_enabled=false").env.tool_control
    assert (default.env.warm_start_episodes, tools.env.warm_start_episodes) == (0, tools.env.demonstrations)
    assert default.model.needs_warm_start and not typed("model.warmstart.steps=0").model.needs_warm_start
    assert not typed("model=qwen3_1_7b").model.needs_warm_start  # a released model starts RL as it is
    assert default.cluster.mesh_nodes == {} and slurm.cluster.mesh_nodes == {"trainer": 1}
    assert typed("algorithm=sft").algorithm.rows_in_flight == 64  # samples none: an evaluation's generator
