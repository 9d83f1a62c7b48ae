"""HF-format checkpoints: save → plain transformers load → identical logits; metadata, optimizer, overwrite."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.models.helpers import build_from, build_tiny
from forge_exp.models.checkpoint import OPTIMIZER, load_hf_checkpoint, save_hf_checkpoint


def small():
    return build_tiny(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64, seed=3)


def test_reload_with_plain_transformers_gives_identical_logits(tmp_path):
    model, tok = small()
    path = save_hf_checkpoint(model, tok, tmp_path / "ckpt")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}
    again = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok2 = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = torch.tensor([tok2("37+48=")["input_ids"], tok2("905*1=")["input_ids"]])
    assert ids.tolist() == [tok("37+48=")["input_ids"], tok("905*1=")["input_ids"]]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    loaded, _ = load_hf_checkpoint(path)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    from_config, _ = build_from(path)  # model.path=<dir> takes the same route
    with torch.no_grad():
        assert torch.equal(model(ids).logits, from_config(ids).logits)


def test_metadata_optimizer_and_overwrite(tmp_path):
    model, tok = small()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[2, 5, 6]])).logits.sum().backward()
    opt.step()
    target = tmp_path / "step_1"
    save_hf_checkpoint(model, tok, target, {"state.json": {"step": 1}}, optimizer=opt)
    assert json.loads((target / "state.json").read_text()) == {"step": 1}
    state = torch.load(target / OPTIMIZER)
    assert state["state"][0]["exp_avg"].shape == next(model.parameters()).shape
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    save_hf_checkpoint(model, tok, target)  # replaces the directory
    assert not (target / "state.json").exists() and not (target / OPTIMIZER).exists()
    again, _ = load_hf_checkpoint(target)
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["step_1"]  # no temporary directories left behind


def test_a_directory_being_replaced_is_never_missing_to_a_reader(tmp_path):
    """A warm-start cache is read by other runs while a run replaces it: the swap leaves the old or the new copy at
    the path at every moment (the old code removed the directory, then renamed the new one in: a reader polling
    config.json found it missing ~5% of the time)."""
    import subprocess
    import sys
    import time

    from forge_exp.models.checkpoint import move_into_place

    target = tmp_path / "cache"
    target.mkdir()
    (target / "config.json").write_text("{}")
    code = ("import os, sys, time\npath = os.path.join(sys.argv[1], 'config.json')\nmissing = looks = 0\n"
            "while not os.path.exists(sys.argv[2]):\n    looks += 1\n    missing += not os.path.exists(path)\n"
            "print(missing, looks)")
    done = tmp_path / "done"
    reader = subprocess.Popen([sys.executable, "-c", code, str(target), str(done)], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the reader is polling
    for i in range(30):
        new = tmp_path / f".cache.{i}"
        new.mkdir()
        (new / "config.json").write_text(json.dumps({"i": i}))
        (new / "model.safetensors").write_bytes(b"x" * 100_000)
        move_into_place(new, target)
        assert not new.exists()  # the old copy is gone
    done.touch()
    missing, looks = map(int, reader.communicate(timeout=60)[0].split())
    assert looks > 100 and missing == 0, (missing, looks)
    assert json.loads((target / "config.json").read_text()) == {"i": 29}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "done"]


def test_a_full_disk_is_named_whatever_the_writer_says(tmp_path, monkeypatch):
    """torch.save on a full disk says "unexpected pos 425152 vs 425044" (its stream loses the errno): the save says
    the disk is full, naming the directory, and leaves nothing half-written behind. The real full disk: tests/faults
    (a tmpfs)."""
    import errno
    import shutil

    import pytest

    from forge_exp.models import checkpoint

    def torch_save_on_a_full_disk(*args):
        raise RuntimeError("unexpected pos 9 vs 7")

    def free(nbytes: int):
        return lambda path: shutil._ntuple_diskusage(nbytes * 2, nbytes, nbytes)

    model, tok = small()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monkeypatch.setattr(checkpoint.torch, "save", torch_save_on_a_full_disk)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", free(4096))
    with pytest.raises(OSError, match=r"^\[Errno 28\] no space left on device \(4096 bytes free\) while writing "
                                      r"\S+step_2; free space there, or write checkpoints elsewhere") as e:
        save_hf_checkpoint(model, tok, tmp_path / "step_2", optimizer=opt)
    assert e.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", free(1 << 40))
    with pytest.raises(RuntimeError, match="unexpected pos 9"):  # room left: not a full disk, its own error
        save_hf_checkpoint(model, tok, tmp_path / "step_2", optimizer=opt)
