"""The TorchTitan trainer's parallelism options: degrees per option, and the one-line errors raised before any
process starts (they name the config keys)."""

import pytest
import torch

from forge_exp.trainers.parallel import Degrees, degrees, validate

QWEN3_1_7B = dict(n_heads=16, n_kv_heads=8, vocab_size=151936)


@pytest.mark.parametrize(
    ("parallelism", "procs", "kw", "expected"),
    [
        ("single", 1, {}, Degrees(1, 1, 1)),
        ("fsdp", 4, {}, Degrees(1, 4, 1)),
        ("fsdp", 8, {"dp_replicate": 2}, Degrees(2, 4, 1)),  # HSDP
        ("tp", 4, {}, Degrees(1, 1, 4)),
        ("fsdp_tp", 8, {"tp": 2}, Degrees(1, 4, 2)),
        ("fsdp_tp", 8, {"tp": 2, "dp_replicate": 2}, Degrees(2, 2, 2)),
    ],
)
def test_degrees(parallelism, procs, kw, expected):
    d = validate(parallelism, procs, procs, **QWEN3_1_7B, **kw)
    assert d == expected and d.world == procs


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        (("hybrid", 2, 0), {}, "parallelism must be one of single, fsdp, tp, fsdp_tp"),
        (("single", 2, 0), {}, "single runs one trainer process"),
        (("fsdp_tp", 6, 0), {"tp": 4}, "procs must be a multiple of parallelism.tp=4"),
        (("fsdp", 4, 2), {}, "services.trainer.procs=4 with services.trainer.gpus=2"),
        (("tp", 3, 0), {}, "tensor-parallel degree 3 must divide the model's attention heads (16)"),
        (("tp", 2, 0), {"dp_replicate": 2}, "parallelism.dp_replicate needs parallelism=fsdp or fsdp_tp"),
    ],
)
def test_errors_name_the_keys(args, kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        validate(*args, **QWEN3_1_7B, **kw)
    assert "\n" not in str(e.value)


def test_vocabulary_must_split_evenly_over_tp():
    with pytest.raises(ValueError, match="vocabulary size"):
        validate("tp", 2, 0, n_heads=4, n_kv_heads=2, vocab_size=97)


def test_pack_left_moves_padding_after_the_real_tokens():
    pytest.importorskip("torchtitan", reason="trainer=titan needs the titan extra")
    from forge_exp.trainers.titan import pack_left

    prompt_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])  # left-padded (pad 0)
    prompt_mask = prompt_ids != 0
    response_ids = torch.tensor([[11, 12, 0], [13, 0, 0]])  # right-padded
    ids, index = pack_left(prompt_ids, prompt_mask, response_ids)
    assert ids.tolist() == [[5, 6, 11, 12, 0, 0, 0], [7, 8, 9, 10, 13, 0, 0]]
    # the hidden state at index[i, j] predicts response token j: prompt length - 1 + j
    assert index.tolist() == [[1, 2, 3], [3, 4, 5]]
    assert all(ids[i, index[i, j] + 1] == response_ids[i, j] for i, j in [(0, 0), (0, 1), (1, 0)])
