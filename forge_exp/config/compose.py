"""The run's config composed in this process, as the CLI composes it (the schemas registered, CLI aliases such as
algorithm.beta expanded): for scripts, benchmarks and tests.

    cfg = compose(["generator=vllm", "algorithm.beta=0"])     # the DictConfig Hydra hands the app
    config = typed(["services.generator.replicas=2"])         # validated: the ForgeConfig services receive
    group_options("logger")                                   # ["mlflow", "tensorboard", "wandb"]
"""

from __future__ import annotations

from omegaconf import DictConfig

from forge_exp.config.aliases import expand
from forge_exp.config.run import ForgeConfig
from forge_exp.config.store import register
from forge_exp.config.validate import validate


def compose(overrides: list[str] = ()) -> DictConfig:
    from hydra import compose as hydra_compose, initialize_config_module

    register()
    with initialize_config_module(config_module="forge_exp.conf", version_base=None):
        return hydra_compose(config_name="config", overrides=expand(list(overrides)))


def typed(overrides: list[str] = ()) -> ForgeConfig:
    return validate(compose(overrides))


def group_options(group: str) -> list[str]:
    """The options of a config group (conf/<group>/*.yaml), as shipped in the package; [] for no such group."""
    from importlib.resources import files

    folder = files("forge_exp.conf").joinpath(*group.split("/")) if group else None
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
