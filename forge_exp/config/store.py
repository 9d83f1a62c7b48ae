"""Registers the schemas with Hydra's ConfigStore: the root schema (`forge_schema`, first in conf/config.yaml's
defaults) and each option's schema under `schema/<group>/<name>`, which the option's YAML names in its defaults
list (`- /schema/model/tiny@_here_`). The schema groups are not options of the groups themselves, so
`algorithm=glob(*)` lists the YAML files only."""

from hydra.core.config_store import ConfigStore

from forge_exp.config.algorithm import ALGORITHM_SCHEMAS, LOSS_SCHEMAS, loss_node
from forge_exp.config.backends import TitanTrainerConfig, TrainerBackend
from forge_exp.config.cluster import CLUSTER_SCHEMAS
from forge_exp.config.dataset import DATASET_SCHEMAS
from forge_exp.config.env import ENV_SCHEMAS
from forge_exp.config.logger import LOGGER_SCHEMAS
from forge_exp.config.model import MODEL_SCHEMAS
from forge_exp.config.run import ForgeConfig
from forge_exp.generators.options import NativeKnobs, VllmOptions

SCHEMAS = {
    "model": MODEL_SCHEMAS,
    "algorithm": ALGORITHM_SCHEMAS,
    "loss": LOSS_SCHEMAS,
    "dataset": DATASET_SCHEMAS,
    "env": ENV_SCHEMAS,
    "trainer": {"hf": TrainerBackend, "titan": TitanTrainerConfig},
    "generator": {"torch": NativeKnobs, "vllm": VllmOptions},
    "cluster": CLUSTER_SCHEMAS,
    "logger": LOGGER_SCHEMAS,
}
# reward, services and parallelism have one shape each: the root schema types them (config/run.py)


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="forge_schema", node=ForgeConfig)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=loss_node(node) if group == "loss" else node)
