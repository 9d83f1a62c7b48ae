"""The vLLM generator's config node: the YAML, its schema and the engine's knobs agree, and bad values name their
key before anything starts. Needs no vLLM."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from forge_exp.config.backends import VllmGenerator
from forge_exp.config.validate import ConfigError, validate
from forge_exp.generators.vllm_options import VllmOptions
from tests.config.helpers import compose_cfg


def test_the_yaml_the_schema_and_the_engine_knobs_agree():
    node = OmegaConf.to_object(compose_cfg("generator=vllm")).generator
    assert isinstance(node, VllmGenerator)
    schema = {f.name for f in dataclasses.fields(VllmGenerator)} - {"_target_"}
    assert schema == {f.name for f in dataclasses.fields(VllmOptions)}


@pytest.mark.parametrize(
    "override,message",
    [
        ("generator.gpu_memory_utilization=1.5", r"^generator\.gpu_memory_utilization must be in \(0, 1\]"),
        ("generator.kv_cache_gib=0", r"^generator\.kv_cache_gib must be in \(0, inf\]"),
        ("generator.tensor_parallel_size=0", r"^generator\.tensor_parallel_size must be >= 1"),
        ("generator.max_model_len=-1", r"^generator\.max_model_len must be >= 1"),
        ("+generator.gpu_mem_util=0.5", r"^generator\.gpu_mem_util is not a config key; did you mean "
                                        r"generator\.gpu_memory_utilization"),
        ("algorithm.top_p=0.9", r"^algorithm\.top_p must be 1 with generator=vllm"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg("generator=vllm", override))


def test_tensor_parallel_generators_need_vllm():
    config = validate(compose_cfg("generator=vllm", "services.generator.procs=2"))
    assert config.services.generator.procs == 2
    with pytest.raises(ConfigError, match=r"^services\.generator\.procs must be 1 for generator=torch"):
        validate(compose_cfg("services.generator.procs=2"))
