"""The TorchTitan trainer's parallelism options: degrees per option, and the one-line errors raised before any
process starts (they name the config keys)."""

import pytest
import torch

from forge_exp.config.validate import ConfigError, validate
from forge_exp.trainers.parallel import Degrees, check_model, degrees
from tests.config.helpers import compose_cfg


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], Degrees(1, 1, 1)),
        (["parallelism=fsdp", "services.trainer.procs=4"], Degrees(1, 4, 1)),
        (["parallelism=fsdp", "services.trainer.procs=8", "parallelism.data_parallel_replicate=2"], Degrees(2, 4, 1)),
        (["parallelism=tp", "services.trainer.procs=4"], Degrees(1, 1, 4)),
        (["parallelism=fsdp_tp", "services.trainer.procs=8"], Degrees(1, 4, 2)),
        (["parallelism=fsdp_tp", "parallelism.tensor_parallel=2", "parallelism.data_parallel_shard=2",
          "services.trainer.procs=4"], Degrees(1, 2, 2)),
        (["parallelism=fsdp_tp", "services.trainer.procs=8", "parallelism.data_parallel_replicate=2"], Degrees(2, 2, 2)),
    ],
)
def test_degrees_from_the_config(overrides, expected):
    config = validate(compose_cfg("trainer=titan", *overrides))
    d = config.parallelism.degrees(config.services.trainer.procs)
    assert d == expected and d.world == config.services.trainer.procs


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["parallelism=hybrid"], r"Could not find 'parallelism/hybrid'"),
        (["trainer=titan", "services.trainer.procs=2"], r"parallelism=single with services.trainer.procs=2: single "
                                                        r"runs one trainer process"),
        (["trainer=titan", "parallelism=fsdp_tp", "parallelism.tensor_parallel=4", "services.trainer.procs=6"],
         r"procs must be a multiple of parallelism\.tensor_parallel=4"),
        (["trainer=titan", "parallelism=fsdp_tp", "parallelism.data_parallel_shard=3", "services.trainer.procs=4"],
         r"^parallelism\.data_parallel_shard=3 does not fit services\.trainer\.procs=4"),
        (["trainer=titan", "parallelism=fsdp", "services.trainer.procs=4", "services.trainer.gpus=2"],
         r"^services\.trainer\.gpus must be 0 or 1 \(GPUs per process\)"),
        (["parallelism=fsdp", "services.trainer.procs=2"], r"^services\.trainer\.procs must be 1 for trainer=hf"),
        (["parallelism=fsdp"], r"^parallelism=fsdp needs trainer=titan"),
        (["trainer=titan", "parallelism=tp", "parallelism.data_parallel_replicate=2"],
         r"^parallelism\.data_parallel_replicate must be 1 for parallelism=tp"),
        (["trainer=titan", "algorithm=sft"], r"^trainer=titan trains the GRPO family; algorithm=sft runs on trainer=hf"),
    ],
)
def test_errors_name_the_keys(overrides, message):
    from hydra.errors import MissingConfigException

    with pytest.raises((ConfigError, MissingConfigException), match=message) as e:
        validate(compose_cfg(*overrides))
    assert "\n" not in str(e.value) or isinstance(e.value, MissingConfigException)


def test_tp_must_divide_heads_and_vocabulary():
    with pytest.raises(ValueError, match=r"tensor-parallel degree 3 must divide the model's attention heads \(16\)"):
        check_model(degrees("tp", 3), n_heads=16, n_kv_heads=8, vocab_size=151936)
    with pytest.raises(ValueError, match="vocabulary size"):
        check_model(degrees("tp", 2), n_heads=4, n_kv_heads=2, vocab_size=97)


def test_pack_left_moves_padding_after_the_real_tokens():
    from forge_exp.models.packing import pack_left

    prompt_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])  # left-padded (pad 0)
    prompt_mask = prompt_ids != 0
    response_ids = torch.tensor([[11, 12, 0], [13, 0, 0]])  # right-padded
    ids, index = pack_left(prompt_ids, prompt_mask, response_ids)
    assert ids.tolist() == [[5, 6, 11, 12, 0, 0, 0], [7, 8, 9, 10, 13, 0, 0]]
    # the hidden state at index[i, j] predicts response token j: prompt length - 1 + j
    assert index.tolist() == [[1, 2, 3], [3, 4, 5]]
    assert all(ids[i, index[i, j] + 1] == response_ids[i, j] for i, j in [(0, 0), (0, 1), (1, 0)])
