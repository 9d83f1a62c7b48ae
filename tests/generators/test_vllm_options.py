"""The vLLM generator's config node: its schema is the engine's own knobs, a null size knob means what its comment
says, and bad values name their key before anything starts. Needs no vLLM."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from forge_exp.config.validate import ConfigError, validate
from forge_exp.generators.options import VllmOptions
from tests.config.helpers import compose_cfg


def test_the_node_is_the_engines_own_options():
    node = OmegaConf.to_object(compose_cfg("generator=vllm")).generator
    assert isinstance(node, VllmOptions) and node == VllmOptions()
    from forge_exp.generators.vllm import VllmEngine

    assert VllmEngine.schema is VllmOptions


def test_an_engine_built_alone_fills_its_null_sizes():
    """Outside a run nothing fills tensor_parallel_size: the engine arguments take one worker, and leave
    max_model_len to vLLM (the model's max_position_embeddings)."""
    pytest.importorskip("vllm")
    from forge_exp.generators.vllm_options import engine_args

    args = engine_args(VllmOptions(), "/nonexistent", "float32", "cpu", 0)
    assert args.tensor_parallel_size == 1 and args.max_model_len is None


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
