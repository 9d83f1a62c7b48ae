"""GPU selection follows the services config (checked without GPUs)."""

import pytest
from omegaconf import OmegaConf

from forge_exp.config.services import ServicesConfig
from forge_exp.runtime.layout import check_gpus, device_of, gpus_needed, needed_services, plan_meshes
from tests.conftest import CONF


def services(name: str, **overrides) -> ServicesConfig:
    node = OmegaConf.merge(OmegaConf.structured(ServicesConfig), OmegaConf.load(CONF / "services" / f"{name}.yaml"))
    for key, value in overrides.items():
        OmegaConf.update(node, key, value)
    return OmegaConf.to_object(node)


def test_cpu_layout_puts_generator_and_trainer_in_their_own_processes():
    meshes = plan_meshes(services("cpu"), needed_services(beta=0.04))
    assert gpus_needed(meshes) == 0
    assert set(meshes) == {"trainer", "generator", "controller"}  # the light services: in the controller's process
    assert sorted(meshes["controller"].services) == ["dataset", "replay_buffer", "reward"]
    assert meshes["trainer"].services == ["trainer", "ref_model"]
    assert device_of(meshes, "generator") == [["cpu"]]


def test_cpu_host_gives_the_light_services_a_process_of_their_own():
    meshes = plan_meshes(services("cpu_host"), needed_services(beta=0.0))
    assert set(meshes) == {"trainer", "generator", "host"}
    assert sorted(meshes["host"].services) == ["dataset", "replay_buffer", "reward"]


@pytest.mark.parametrize("key", ["replicas", "gpus"])
def test_a_service_in_the_controller_cannot_replicate_or_take_a_gpu(key):
    from forge_exp.config.checks import FieldError

    with pytest.raises(FieldError, match=r"reward\.mesh.*controller"):
        services("cpu", **{f"reward.{key}": 2 if key == "replicas" else 1})


def test_reference_model_is_left_out_when_beta_is_zero():
    meshes = plan_meshes(services("cpu"), needed_services(beta=0.0))
    assert all("ref_model" not in m.services for m in meshes.values())


def test_single_gpu_colocates_trainer_reference_and_generator_on_gpu0():
    meshes = plan_meshes(services("single_gpu"), needed_services(beta=0.04))
    assert gpus_needed(meshes) == 1
    for name in ("trainer", "ref_model", "generator"):
        assert device_of(meshes, name) == [["cuda:0"]]
    assert device_of(meshes, "reward") == [["cpu"]]


def test_multi_gpu_splits_trainer_and_generator():
    meshes = plan_meshes(services("multi_gpu"), needed_services(beta=0.04))
    assert device_of(meshes, "trainer") == [["cuda:0"]]
    assert device_of(meshes, "ref_model") == [["cuda:0"]]
    assert device_of(meshes, "generator") == [["cuda:1"]]


def test_three_gpu_layout_and_a_second_generator_replica():
    meshes = plan_meshes(services("three_gpu"), needed_services(beta=0.04))
    assert [device_of(meshes, s) for s in ("trainer", "ref_model", "generator")] == [
        [["cuda:0"]], [["cuda:1"]], [["cuda:2"]]
    ]
    meshes = plan_meshes(services("three_gpu", **{"generator.replicas": 2}), needed_services(beta=0.04))
    assert device_of(meshes, "generator") == [["cuda:2"], ["cuda:3"]]
    assert gpus_needed(meshes) == 4


def test_more_gpus_than_visible_is_one_clear_error():
    meshes = plan_meshes(services("three_gpu"), needed_services(beta=0.04))
    with pytest.raises(ValueError, match=r"services needs 3 GPUs .* but 1 are visible"):
        check_gpus(meshes, available=1)


def test_colocated_services_must_agree_on_gpus():
    with pytest.raises(ValueError, match=r"services.ref_model.gpus=0 differs"):
        plan_meshes(services("single_gpu", **{"ref_model.gpus": 0}), needed_services(beta=0.04))


def test_bad_service_values_name_the_key():
    with pytest.raises(ValueError, match=r"^generator.gpus must be 0 or 1"):
        services("cpu", **{"generator.gpus": 2})
    with pytest.raises(ValueError, match=r"^trainer.replicas must be 1"):
        services("cpu", **{"trainer.replicas": 2})
