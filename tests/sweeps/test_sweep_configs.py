"""Every named sweep composes and every point of its space is a valid run; the launcher configs size a job from the
`services` layout and take the cluster settings from the user's cluster file."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from omegaconf import OmegaConf, read_write

from forge_exp.cli import _register_launchers
from forge_exp.config.validate import validate
from forge_exp.launch import resources, sweep
from tests.config.helpers import compose_cfg as compose_job

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps" / "sweep"
# conf/hydra/launcher/*.yaml extend the plugin's schema of the same name on purpose (cli.py silences this too)
pytestmark = pytest.mark.filterwarnings("ignore:.*validated against ConfigStore schema with the same name")
_register_launchers()  # the launcher plugins (as cli.py does; importing forge_exp.cli registered the schemas)


@pytest.fixture(autouse=True)
def _no_user_cluster_file(tmp_path, monkeypatch):  # a developer's ~/.config/forge-exp/cluster.yaml stays out
    (tmp_path / "empty.yaml").write_text("")
    monkeypatch.setenv(resources.CLUSTER_ENV, str(tmp_path / "empty.yaml"))


def compose_cfg(*overrides: str, hydra: bool = False):
    if not hydra:
        return compose_job(*overrides)
    with initialize_config_module(config_module="forge_exp.conf", version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def grid_points(params: dict) -> list[list[str]]:
    parser = OverridesParser.create()
    axes = [[f"{key}={v}" for v in parser.parse_override(f"{key}={spec}").sweep_string_iterator()]
            for key, spec in params.items()]
    return [list(p) for p in itertools.product(*axes)]


def optuna_corners(params: dict) -> list[list[str]]:
    from hydra_plugins.hydra_optuna_sweeper._impl import create_optuna_distribution_from_override

    parser = OverridesParser.create()
    dists = {key: create_optuna_distribution_from_override(parser.parse_override(f"{key}={spec}"))
             for key, spec in params.items()}
    ends = {k: (d.choices[0], d.choices[-1]) if hasattr(d, "choices") else (d.low, d.high) for k, d in dists.items()}
    return [[f"{k}={v[i]}" for k, v in ends.items()] for i in (0, 1)]


@pytest.mark.parametrize("name", sorted(p.stem for p in SWEEPS.glob("*.yaml")))
def test_every_named_sweep_composes_and_its_space_is_valid(name):
    cfg = compose_cfg(f"+sweep={name}", hydra=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert {"algorithm.loss.beta", "algorithm.loss.clip_low", "algorithm.loss.clip_high"} <= set(params), params
    optuna = "optuna" in cfg.hydra.sweeper._target_
    points = optuna_corners(params) if optuna else grid_points(params)
    if optuna:
        assert cfg.hydra.sweeper.direction == "maximize" and "TPESampler" in cfg.hydra.sweeper.sampler._target_
    else:
        assert len(points) == 8
    for point in points:
        validate(compose_cfg(f"+sweep={name}", *point))  # schema, ranges, the loss builds


@pytest.mark.parametrize(
    "services,gpus,cpus,mem_gb",
    [("cpu", None, 4, 16), ("single_gpu", 1, 6, 44), ("multi_gpu", 2, 10, 80)],  # from conf/services/*.yaml
)
def test_slurm_launcher_resources_follow_the_services_layout(services, gpus, cpus, mem_gb):
    launcher = compose_cfg("hydra/launcher=submitit_slurm", f"services={services}", hydra=True).hydra.launcher
    assert (launcher.gpus_per_node, launcher.cpus_per_task, launcher.mem_gb) == (gpus, cpus, mem_gb)
    assert launcher._target_ == "hydra_plugins.forge_exp_launcher.launcher.SlurmLauncher"
    assert launcher.partition is None and launcher.timeout_min == 240 and launcher.max_num_timeout == 3


def test_cluster_file_sets_partition_account_qos_and_limits(tmp_path, monkeypatch):
    (tmp_path / "cluster.yaml").write_text(
        "partition: gpu\naccount: rl-team\nqos: high\nconstraint: h100\ntimeout_min: 600\nmem_gb_per_gpu: 64\n"
        "additional_parameters: {mail-type: END}\n"
    )
    monkeypatch.setenv(resources.CLUSTER_ENV, str(tmp_path / "cluster.yaml"))
    cfg = compose_cfg("hydra/launcher=submitit_slurm", "services=single_gpu", "hydra.launcher.qos=low", hydra=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert {k: launcher[k] for k in ("partition", "account", "qos", "constraint", "timeout_min", "mem_gb")} == {
        "partition": "gpu", "account": "rl-team", "qos": "low", "constraint": "h100", "timeout_min": 600,
        "mem_gb": 3 * 4 + 64,  # the command line wins over the file
    }
    assert launcher["additional_parameters"] == {"mail-type": "END"}

    (tmp_path / "cluster.yaml").write_text("partion: gpu\n")
    with pytest.raises(Exception) as error:  # composing already resolves it (Hydra merges the plugin's schema)
        OmegaConf.to_container(compose_cfg("hydra/launcher=submitit_slurm", hydra=True).hydra.launcher, resolve=True)
    assert "unknown cluster settings ['partion']" in f"{error.value} {error.value.__cause__}"


def test_local_launcher_and_launcher_plugins_are_registered():
    launcher = compose_cfg("hydra/launcher=submitit_local", hydra=True).hydra.launcher
    assert launcher._target_ == "hydra_plugins.forge_exp_launcher.launcher.LocalLauncher"
    assert launcher.cpus_per_task == 4 and launcher.gpus_per_node is None
    known = Plugins.instance().class_name_to_class
    assert {"hydra_plugins.forge_exp_launcher.launcher.SlurmLauncher",
            "hydra_plugins.forge_exp_launcher.launcher.LocalLauncher"} <= set(known)


def test_sweep_space_reads_the_command_line_and_named_sweeps():
    cfg = compose_cfg("+sweep=grpo_beta_clip", hydra=True)
    with read_write(cfg):  # as Hydra records them for `-m algorithm.group_size=4,8 steps=3`
        cfg.hydra.overrides.task = ["algorithm.group_size=4,8", "steps=3", "+sweep=grpo_beta_clip"]
    swept, fixed = sweep.sweep_space(cfg)
    assert swept == {"algorithm.group_size": "4,8", "algorithm.loss.beta": "0,0.04",
                     "algorithm.loss.clip_low": "0.1,0.2", "algorithm.loss.clip_high": "0.2,0.28"}
    assert fixed == {"steps": "3", "sweep": "grpo_beta_clip"}


def test_a_sweep_job_is_named_by_its_swept_values():
    swept = ["algorithm.loss.beta", "algorithm.loss.clip_high", "algorithm"]
    name = sweep.run_name(["algorithm.loss.beta=0.04", "steps=3", "algorithm.loss.clip_high=0.28", "algorithm=dapo"],
                          swept)
    assert name == "beta=0.04,clip_high=0.28,algorithm=dapo"
    assert sweep.run_name(["steps=3"], swept) is None
    assert sweep.run_name(["a.x=1", "b.x=2"], ["a.x", "b.x"]) == "a.x=1,b.x=2"  # the same leaf twice: full keys


def test_the_compare_url_lists_the_children():
    url = sweep.compare_url({"uri": "http://mlflow:5000", "experiment_id": "3"}, ["r1", "r2"])
    assert url == "http://mlflow:5000/#/compare-runs?runs=%5B%22r1%22%2C%22r2%22%5D&experiments=%5B%223%22%5D&workflowType=machine_learning"
