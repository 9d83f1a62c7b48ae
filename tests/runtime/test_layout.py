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
    meshes = plan_meshes(services("cpu"), needed_services(reference=True))
    assert gpus_needed(meshes) == 0
    assert set(meshes) == {"trainer", "generator", "controller"}  # the light services: in the controller's process
    assert sorted(meshes["controller"].services) == ["dataset", "replay_buffer", "reward"]
    assert meshes["trainer"].services == ["trainer", "ref_model"]
    assert device_of(meshes, "generator") == [["cpu"]]


def test_cpu_host_gives_the_light_services_a_process_of_their_own():
    meshes = plan_meshes(services("cpu_host"), needed_services(reference=False))
    assert set(meshes) == {"trainer", "generator", "host"}
    assert sorted(meshes["host"].services) == ["dataset", "replay_buffer", "reward"]


@pytest.mark.parametrize("key", ["replicas", "gpus"])
def test_a_service_in_the_controller_cannot_replicate_or_take_a_gpu(key):
    from forge_exp.checks import FieldError

    with pytest.raises(FieldError, match=r"reward\.mesh.*controller"):
        services("cpu", **{f"reward.{key}": 2 if key == "replicas" else 1})


def test_reference_model_is_left_out_when_beta_is_zero():
    meshes = plan_meshes(services("cpu"), needed_services(reference=False))
    assert all("ref_model" not in m.services for m in meshes.values())


TITAN_2 = ["trainer=titan", "parallelism=fsdp", "services.trainer.procs=2"]


@pytest.mark.parametrize("overrides,service", [
    (["services=three_gpu", "algorithm.beta=0.04"], True),
    (["services=three_gpu", "algorithm.beta=0"], False),
    (["services=three_gpu", "algorithm.beta=0.04", "experiment=tiny_lora"], False),  # the trainer's base
    (["services=three_gpu", "algorithm.beta=0.04", "trainer=titan", "trainer.hosts_reference=true"], False),
    (["services=three_gpu", "algorithm.beta=0.04", "trainer=titan"], True),  # null: a mesh of its own there
    (["services=cpu", "algorithm.beta=0.04", *TITAN_2], False),  # null: the trainer's mesh, two processes
    (["services=cpu", "algorithm.beta=0.04", *TITAN_2, "services.ref_model.mesh=''"], True),
    (["services=cpu", "algorithm.beta=0.04", "trainer=titan"], False),  # null: the trainer's mesh, one process
    (["services=cpu", "algorithm.beta=0.04", "trainer=titan", "trainer.hosts_reference=false"], True),
], ids=["kl", "no_kl", "lora", "hosted", "titan_own_mesh", "titan_2_procs", "titan_2_procs_own_mesh", "titan_1_proc",
    "titan_1_proc_service"])
def test_a_run_plans_a_reference_service_only_when_no_trainer_answers_for_it(overrides, service):
    """plan_for (what preflight and the CLI use) plans the reference model's mesh (with services=three_gpu, its
    GPU) only when it is a service of its own; trainer.hosts_reference left null hosts it in a titan trainer whose
    mesh the reference would share."""
    from forge_exp.runtime.layout import plan_for
    from tests.config.helpers import typed

    config = typed(*overrides)
    meshes = plan_for(config)
    assert config.reference_service is service
    assert any("ref_model" in m.services for m in meshes.values()) is service
    if "services=three_gpu" in overrides:
        assert gpus_needed(meshes) == (3 if service else 2)


def test_single_gpu_colocates_trainer_reference_and_generator_on_gpu0():
    meshes = plan_meshes(services("single_gpu"), needed_services(reference=True))
    assert gpus_needed(meshes) == 1
    for name in ("trainer", "ref_model", "generator"):
        assert device_of(meshes, name) == [["cuda:0"]]
    assert device_of(meshes, "reward") == [["cpu"]]


def test_multi_gpu_splits_trainer_and_generator():
    meshes = plan_meshes(services("multi_gpu"), needed_services(reference=True))
    assert device_of(meshes, "trainer") == [["cuda:0"]]
    assert device_of(meshes, "ref_model") == [["cuda:0"]]
    assert device_of(meshes, "generator") == [["cuda:1"]]


def test_three_gpu_layout_and_a_second_generator_replica():
    meshes = plan_meshes(services("three_gpu"), needed_services(reference=True))
    assert [device_of(meshes, s) for s in ("trainer", "ref_model", "generator")] == [
        [["cuda:0"]], [["cuda:1"]], [["cuda:2"]]
    ]
    meshes = plan_meshes(services("three_gpu", **{"generator.replicas": 2}), needed_services(reference=True))
    assert device_of(meshes, "generator") == [["cuda:2"], ["cuda:3"]]
    assert gpus_needed(meshes) == 4


def test_more_gpus_than_visible_is_one_clear_error():
    meshes = plan_meshes(services("three_gpu"), needed_services(reference=True))
    with pytest.raises(ValueError, match=r"services needs 3 GPUs .* but 1 are visible"):
        check_gpus(meshes, available=1)


def test_colocated_services_must_agree_on_gpus():
    with pytest.raises(ValueError, match=r"services.ref_model.gpus=0 differs.*services.ref_model.mesh=''.*"
                                         r"trainer.hosts_reference=true"):
        plan_meshes(services("single_gpu", **{"ref_model.gpus": 0}), needed_services(reference=True))
    with pytest.raises(ValueError, match=r"services.ref_model.procs=1 differs from 2 of services.trainer"):
        plan_meshes(services("cpu", **{"trainer.procs": 2}), needed_services(reference=True))


def test_bad_service_values_name_the_key():
    with pytest.raises(ValueError, match=r"^generator.gpus must be 0 or 1"):
        services("cpu", **{"generator.gpus": 2})
    with pytest.raises(ValueError, match=r"^trainer.replicas must be 1"):
        services("cpu", **{"trainer.replicas": 2})


# ---- meshes on cluster nodes (cluster.hosts) ------------------------------------------------------------------------


def test_a_mesh_on_cluster_nodes_numbers_its_own_gpus_and_leaves_this_hosts_to_the_others():
    meshes = plan_meshes(services("multi_gpu"), needed_services(reference=True), hosts={"trainer": 1})
    assert meshes["trainer"].nodes == 1 and meshes["generator"].nodes == 0
    assert device_of(meshes, "trainer") == [["cuda:0"]]  # GPU 0 of its SLURM node
    assert device_of(meshes, "generator") == [["cuda:0"]]  # this host's GPU 0: the trainer is not here
    assert gpus_needed(meshes) == 1
    check_gpus(meshes, available=1)


def test_replicas_spread_over_nodes_each_numbering_from_gpu0():
    meshes = plan_meshes(services("three_gpu", **{"generator.replicas": 4}), needed_services(reference=False),
                         hosts={"generator": 2})
    gen = meshes["generator"]
    assert gen.per_host == {"replicas": 2, "procs": 1} and gen.procs_per_host == 2
    assert gen.devices == [["cuda:0"], ["cuda:1"], ["cuda:0"], ["cuda:1"]]  # hosts-major: replicas 0, 1 on host 0
    assert gpus_needed(meshes) == 1  # the trainer, here


def test_one_replica_on_several_nodes_spreads_its_procs():
    meshes = plan_meshes(services("multi_gpu", **{"trainer.procs": 4}), needed_services(reference=False),
                         hosts={"trainer": 2})
    trainer = meshes["trainer"]
    assert trainer.per_host == {"replicas": 1, "procs": 2}
    assert trainer.devices == [["cuda:0", "cuda:1", "cuda:0", "cuda:1"]]


def test_the_default_layout_is_planned_as_before():
    before = plan_meshes(services("three_gpu"), needed_services(reference=True))
    assert all(p.nodes == 0 and p.per_host == {"replicas": p.replicas, "procs": p.spawn_procs}
               for p in before.values())
    assert before == plan_meshes(services("three_gpu"), needed_services(reference=True), hosts={})


@pytest.mark.parametrize("layout,overrides,hosts,message", [
    ("cpu", {}, {"gpu": 1}, r"^cluster\.hosts\.gpu: this run has no proc mesh 'gpu' \(its meshes: trainer, "
                            r"generator, controller\)"),
    ("cpu", {}, {"controller": 1}, r"^cluster\.hosts\.controller: the 'controller' mesh is the controller's own "
                                   r"process \(services\.reward, .*\), which stays on this host"),
    ("three_gpu", {}, {"ref_model": 1}, r"^cluster\.hosts\.ref_model: this run has no proc mesh"),  # beta == 0
    ("three_gpu", {"generator.replicas": 3}, {"generator": 2},
     r"^cluster\.hosts\.generator=2: mesh 'generator' has 3 replica\(s\) of 1 proc\(s\) \(services\.generator\), "
     r"which do not spread evenly over 2 hosts"),
    ("multi_gpu", {"trainer.procs": 3}, {"trainer": 2}, r"^cluster\.hosts\.trainer=2: .* do not spread evenly"),
])
def test_hosts_that_do_not_fit_the_layout_are_one_error_naming_the_key(layout, overrides, hosts, message):
    with pytest.raises(ValueError, match=message):
        plan_meshes(services(layout, **overrides), needed_services(reference=False), hosts=hosts)


def test_a_replica_whose_engine_drives_its_devices_stays_on_one_host():
    spec = services("three_gpu", **{"generator.procs": 2})
    with pytest.raises(ValueError, match=r"cluster\.hosts\.generator=2: .*stays on one host"):
        plan_meshes(spec, needed_services(reference=False), frozenset({"generator"}), hosts={"generator": 2})
    meshes = plan_meshes(spec, needed_services(reference=False), frozenset({"generator"}), hosts={"generator": 1})
    assert meshes["generator"].per_host == {"replicas": 1, "procs": 1}
    assert meshes["generator"].devices == [["cuda:0", "cuda:1"]]
