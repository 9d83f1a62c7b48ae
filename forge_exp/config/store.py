"""Registers the root schema with Hydra's ConfigStore. Its fields are typed by each group's dataclass, so every
group's YAML merges onto its schema: an unknown key or a wrong type is an error before anything starts. (The groups
are not registered as options of their own: `algorithm=glob(*)` must list the YAML files only.)"""

from hydra.core.config_store import ConfigStore

from forge_exp.config.run import ForgeConfig


def register() -> None:
    ConfigStore.instance().store(name="forge_schema", node=ForgeConfig)
