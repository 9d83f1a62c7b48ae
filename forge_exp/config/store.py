"""Registers every config schema with Hydra's ConfigStore, so each group's YAML is checked against its dataclass:
an unknown key or a wrong type is an error before anything starts."""

from hydra.core.config_store import ConfigStore

from forge_exp.config.algorithm import AlgorithmConfig
from forge_exp.config.dataset import DatasetConfig
from forge_exp.config.model import ModelConfig
from forge_exp.config.reward import RewardConfig
from forge_exp.config.run import ForgeConfig
from forge_exp.config.services import ParallelismConfig, ServicesConfig

GROUPS = {
    "model": ModelConfig,
    "algorithm": AlgorithmConfig,
    "reward": RewardConfig,
    "dataset": DatasetConfig,
    "parallelism": ParallelismConfig,
    "services": ServicesConfig,
}


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="forge_schema", node=ForgeConfig)
    for group, schema in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=schema)
