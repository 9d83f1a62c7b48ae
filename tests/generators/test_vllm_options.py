"""The vLLM generator's config node: the YAML and its schema agree, and bad values name their key. Needs no vLLM."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from forge_exp.generators.vllm_options import VllmOptions
from tests.conftest import CONF


def test_the_yaml_builds_the_schema_with_every_key():
    node = OmegaConf.to_container(OmegaConf.load(CONF / "generator" / "vllm.yaml"))
    assert set(node) == {f.name for f in dataclasses.fields(VllmOptions)}
    assert VllmOptions.from_knobs(**node) == VllmOptions()


@pytest.mark.parametrize(
    "knobs,key",
    [
        ({"gpu_memory_utilization": 1.5}, "generator.gpu_memory_utilization"),
        ({"kv_cache_gib": 0}, "generator.kv_cache_gib"),
        ({"tensor_parallel_size": 0}, "generator.tensor_parallel_size"),
        ({"max_model_len": -1}, "generator.max_model_len"),
        ({"dtype": "fp8"}, "generator.dtype"),
        ({"inflight_update": "abort"}, "generator.inflight_update"),
        ({"gpu_mem_util": 0.5}, "gpu_mem_util"),
    ],
)
def test_bad_values_name_the_key(knobs, key):
    with pytest.raises(ValueError, match=key):
        VllmOptions.from_knobs(**knobs)
