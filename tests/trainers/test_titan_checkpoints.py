"""TorchTitan trainer checkpoints on real gloo worlds (CPU): HF safetensors in → save_hf → transformers loads the
identical model; DCP saved with 2 processes resumes on 1 and saved with 1 resumes on 2, continuing exactly; and
weight sync from the sharded trainer delivers its full weights to an HF generator model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan", reason="trainer=titan needs the titan extra")

from transformers import AutoModelForCausalLM  # noqa: E402

from tests.trainers.titan_cases import assert_same_steps, make_batches, run_world, tiny_model  # noqa: E402


def _case(tmp_path, family: str) -> tuple[str, str, torch.nn.Module]:
    model = tiny_model(family, seed=7)
    model.save_pretrained(tmp_path / "hf")
    torch.save(make_batches(model, seed=9), tmp_path / "batches.pt")
    return str(tmp_path / "hf"), str(tmp_path / "batches.pt"), model


def _assert_round_trip(original: torch.nn.Module, saved_dir) -> None:
    """transformers loads what save_hf wrote: the same tensors, bit for bit, so the same logits."""
    loaded = AutoModelForCausalLM.from_pretrained(saved_dir)
    theirs = dict(loaded.named_parameters())
    assert theirs.keys() == dict(original.named_parameters()).keys()
    for name, p in original.named_parameters():
        assert torch.equal(theirs[name], p), name
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, original(ids).logits)


@pytest.mark.parametrize(("family", "saved_on", "resumed_on"), [("qwen3", ("fsdp", 2), ("single", 1)),
                                                                 ("llama3", ("single", 1), ("fsdp", 2))])
@pytest.mark.slow
def test_dcp_saved_with_n_procs_resumes_with_m(tmp_path, family, saved_on, resumed_on):
    checkpoint, batches, model = _case(tmp_path, family)
    (save_par, n), (load_par, m) = saved_on, resumed_on
    saved = run_world(n, tmp_path / "runs", "save_job", checkpoint=checkpoint, batches=batches, parallelism=save_par,
                      out_dir=str(tmp_path / "dcp"), hf_dir=str(tmp_path / "hf_out"), grad_accum=2 // n)
    _assert_round_trip(model, tmp_path / "hf_out")
    resumed = run_world(m, tmp_path / "runs", "resume_job", checkpoint=checkpoint, batches=batches,
                        parallelism=load_par, dcp_dir=str(tmp_path / "dcp"), grad_accum=2 // m)
    assert resumed["step"] == 1
    # the step after the checkpoint (weights + AdamW moments restored) is the step the saving run took (the same
    # two micro-batches: 2 ranks x grad_accum 1 or 1 rank x grad_accum 2)
    assert_same_steps([resumed["after_resume"]], [saved["after_resume"]], f"{family} dcp {n}->{m}")


@pytest.mark.slow
@pytest.mark.parametrize(("world", "parallelism", "views"), [(2, "fsdp", False), (1, "single", True)])
def test_weight_sync_from_the_sharded_trainer(tmp_path, world, parallelism, views):
    """Sharded, the full weights are gathered; on one process they are copied from the parameters' own storage
    (checked against the gathered stream at the first version). Both load into the generator's model exactly."""
    checkpoint, batches, _ = _case(tmp_path, "qwen3")
    out = run_world(world, tmp_path / "runs", "sync_job", checkpoint=checkpoint, batches=batches,
                    parallelism=parallelism)
    full = out["full"]
    nbytes = sum(t.numel() * 4 for t in full.values())
    f32, bf16 = out["None"], out[str(torch.bfloat16)]
    assert f32["transport"] == bf16["transport"] == "local"
    assert f32["stats"]["sync/snapshot_bytes"] == nbytes and bf16["stats"]["sync/snapshot_bytes"] == nbytes / 2
    assert bool(f32["views"]) == bool(bf16["views"]) == views
    for name, t in full.items():
        assert torch.equal(f32["loaded"][name], t), name
        assert torch.equal(f32["state"][name], t), name
        assert torch.equal(bf16["loaded"][name], t.to(torch.bfloat16).float()), name
        assert bf16["state"][name].dtype == torch.bfloat16
    later = out["next"]
    assert later["full"].keys() == later["snapshot"].keys()
    for name, t in later["full"].items():  # the snapshot followed the step
        assert torch.equal(later["snapshot"][name], t), name
    moved = [n for n, t in later["full"].items() if not torch.equal(t, full[n].to(torch.bfloat16))]
    assert len(moved) > len(full) / 2, moved  # (some norm weights move less than a bf16 step)
