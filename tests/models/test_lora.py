"""LoRA through peft (models/lora.py, trainers/hf.py, generators/native.py), without processes: only the adapters
train, the reference by disabling them equals a frozen copy, adapter-only sync leaves the native engine generating
what a merged model generates, and checkpoints round-trip (peft's format, the merge command, an exact resume)."""

from __future__ import annotations

import asyncio
import copy
import sys

import pytest
import torch

from forge_exp.generators.base import Sampling
from forge_exp.generators.native import NativeEngine
from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.models.lora import DEFAULT_TARGETS, Lora, adapter_layout
from forge_exp.models.merge import merge_main
from forge_exp.models.tiny import TinyQwen3
from forge_exp.rl.losses.grpo import GRPOLoss
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers.hf import HFTrainer
from forge_exp.trainers.update import available_inputs
from tests.models.helpers import PROMPTS, encode, train_batch

peft = pytest.importorskip("peft")
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "layers": None}
SIZES = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128)


def spec(path=None, **lora) -> TinyQwen3:
    return TinyQwen3(**SIZES, path=path, lora={**LORA, **lora})


def trainer(path=None, resume_step: int = 0, lr: float = 0.05, **lora) -> HFTrainer:
    torch.manual_seed(0)  # the trainer actor seeds its process so (actors/placement.py): a fresh adapter's init
    return HFTrainer(spec(path, **lora), GRPOLoss(beta=0.04), device=torch.device("cpu"), lr=lr, weight_decay=0.0,
                     loss_inputs=available_inputs(reference=True), init_path=path, resume_step=resume_step)


def batch(seed: int = 0) -> TrainBatch:
    return train_batch(PROMPTS, [[5 + (i + j) % 9 for j in range(2 + i % 4)] for i in range(6)], seed)


def train(t: HFTrainer, steps: int, first: int = 0) -> None:
    for i in range(first, first + steps):
        t.train_step(batch(i), grad_accum=2, max_grad_norm=1.0, temperature=1.0, mask_truncated=False)


def logprobs(model, b: TrainBatch) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)[0]


def test_only_the_adapters_train():
    t = trainer()
    base = {n: p.detach().clone() for n, p in t.model.named_parameters() if "lora_" not in n}
    train(t, 3)
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7 * SIZES["num_layers"]  # A and B of q,k,v,o,gate,up,down in every layer
    state = t.optimizer.state_dict()["state"]
    assert len(state) == len(trainable) and len(t.optimizer.param_groups[0]["params"]) == len(trainable)
    for n, p in t.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n  # the frozen base did not move
    lora_b = [p for n, p in t.model.named_parameters() if ".lora_B." in n]
    assert all(p.abs().sum() > 0 for p in lora_b)  # ... and the adapters did (B starts at zero)
    published = t.published()
    assert list(published) == [n.replace(".default.", ".") for n in trainable]
    assert all(p.dtype == torch.float32 for p in published.values())


def test_reference_by_disabling_equals_a_frozen_copy():
    t = trainer()
    train(t, 3)
    b = batch(7)
    frozen = spec().base().build()  # a separate copy of the initial policy, as actors/reference.py holds it
    ref = t.ref_logprobs(b, temperature=1.0)
    assert torch.equal(ref, logprobs(frozen, b))
    assert not torch.allclose(ref, logprobs(t.model, b))  # the adapters do change the policy
    for training in (True, False):  # it restores the mode it found
        t.model.train(training)
        t.ref_logprobs(b, temperature=1.0)
        assert t.model.training is training


def generate(engine: NativeEngine, seed: int) -> list:
    async def run():
        greedy = await engine.generate(encode(PROMPTS), Sampling(1, 0.0, 1.0, 8, seed))
        sampled = await engine.generate(encode(PROMPTS), Sampling(3, 1.0, 1.0, 8, seed))
        return greedy + sampled

    return asyncio.run(run())


def test_adapter_sync_leaves_the_engine_equal_to_a_merged_model():
    from forge_exp.runtime.weight_sync import WeightPublisher, WeightReceiver

    t = trainer(lr=0.2)
    train(t, 4)
    # (each engine generates once: an engine's later calls may differ from a fresh one's in the last bits, as the
    # cache length its attention reads depends on what ran before)
    with NativeEngine(spec(), slots=8, max_len=32) as engine:
        receiver = WeightReceiver(engine.parameters(), torch.device("cpu"))
        publisher = WeightPublisher(t.published())
        assert receiver.receive(publisher.publish(1)) == "local"  # the layouts agree, name by name
        receiver.load(engine.load_weights)
        assert publisher.payload_bytes == sum(p.numel() * 4 for p in t.published().values())
        synced = generate(engine, seed=3)
    with NativeEngine(spec(), slots=8, max_len=32) as engine:
        engine.load_weights([(n, p * 3) for n, p in t.published().items()])  # an older version, then this one:
        engine.load_weights(t.published().items())  # each push is merged into the base, not onto the last one
        again = generate(engine, seed=3)
    with NativeEngine(spec(), slots=8, max_len=32) as engine:
        before = generate(engine, seed=3)
    merged = copy.deepcopy(t.model).merge_and_unload()
    with NativeEngine.from_model(merged, spec().tokenizer(), slots=8, max_len=32) as reference:
        expected = generate(reference, seed=3)
    assert synced == expected and again == expected
    assert before != expected


def test_adapter_layout_matches_what_the_trainer_publishes():
    from tests.generators.helpers import tiny_llama, tiny_qwen2

    for model in (spec().base().build(), tiny_llama(), tiny_qwen2()):
        for lora in (Lora(4, 8.0, 0.0, None, None), Lora(2, 4.0, 0.0, ("q_proj", "down_proj"), (1,))):
            layout = adapter_layout(model, lora)
            wrapped = peft.get_peft_model(copy.deepcopy(model), lora.peft_config(model))
            published = {n.replace(".default.", "."): p for n, p in wrapped.named_parameters() if p.requires_grad}
            assert [(n, tuple(t.shape)) for n, t in layout.items()] == [
                (n, tuple(p.shape)) for n, p in published.items()]
    assert set(DEFAULT_TARGETS) == {"qwen3", "llama", "qwen2"}


def test_checkpoint_round_trip_merge_and_exact_resume(tmp_path):
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    spec().base().build().save_pretrained(base_dir)  # a warm start: the base the adapters train on
    spec().tokenizer().save_pretrained(base_dir)
    t = trainer(str(base_dir))
    train(t, 3)
    ckpt = t.save(str(tmp_path / "step_3"))
    names = {p.name for p in (tmp_path / "step_3").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt"} <= names
    assert "model.safetensors" not in names
    b = batch(5)
    want = logprobs(t.model, b)

    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), ckpt)
    assert torch.allclose(logprobs(loaded, b), want, atol=1e-5)
    assert torch.equal(logprobs(TinyQwen3(**SIZES, path=ckpt).build(), b),  # model.path=<adapter dir>: merged
                       logprobs(copy.deepcopy(t.model).merge_and_unload(), b))
    merge_main([ckpt, str(tmp_path / "merged")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(logprobs(merged, b), want, atol=1e-5)

    resumed = trainer(ckpt, resume_step=3)  # base from the adapter's base_model_name_or_path, adapters trainable
    for (n, p), (m, q) in zip(t.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert n == m and torch.equal(p, q) and p.requires_grad == q.requires_grad, n
    train(t, 2, first=3)
    train(resumed, 2, first=3)
    for p, q in zip(t.published().values(), resumed.published().values(), strict=True):
        assert torch.equal(p, q)
    sa, sb = t.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[k][s], sb[k][s]) for k in sa for s in ("exp_avg", "exp_avg_sq", "step"))


def test_warm_start_trains_the_base_and_adapters_start_fresh_on_it(tmp_path):
    from forge_exp.rl.types import Problem

    t = trainer()
    fresh = [p.detach().clone() for p in t.published().values()]
    problems = [Problem(prompt=f"{i}+{i}=", target=str(2 * i)) for i in range(8)]
    t.warm_start(problems, steps=2, lr=1e-2, batch_size=4, target_accuracy=None, seed=0,
                 directory=str(tmp_path / "warm"))
    assert (tmp_path / "warm" / "model.safetensors").is_file()  # the whole base, as without LoRA
    warm = TinyQwen3(**SIZES, path=str(tmp_path / "warm")).build()
    assert not torch.equal(warm.model.layers[0].mlp.up_proj.weight, spec().base().build().model.layers[0].mlp.up_proj.weight)
    assert all(torch.equal(p, q) for p, q in zip(fresh, t.published().values()))  # the same init as a cached run's
    b = batch(1)
    assert torch.equal(logprobs(t.model, b), logprobs(warm, b))  # B = 0: the adapted model is the warm base
    cached = trainer(str(tmp_path / "warm"))  # a later run, loading the cached warm start, trains as this one does
    train(t, 2)
    train(cached, 2)
    assert all(torch.equal(p, q) for p, q in zip(t.published().values(), cached.published().values()))


def test_bad_adapters_are_one_line_before_anything_starts(monkeypatch):
    from forge_exp.apps.preflight import check_lora

    with pytest.raises(ValueError, match=r"^model\.lora\.target_modules: the model has no wq, c_attn; its linear "
                                         r"modules are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj$"):
        check_lora(spec(target_modules=["q_proj", "wq", "c_attn"]))
    with pytest.raises(ValueError, match=r"^model\.lora\.layers: the model has layers 0\.\.1, got 2$"):
        check_lora(spec(layers=[0, 2]))
    check_lora(spec(target_modules=["q_proj", "v_proj"], layers=[1]))  # a subset is fine
    monkeypatch.setitem(sys.modules, "peft", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"^model\.lora needs peft, which is not installed: "
                                         r"pip install 'forge-exp\[lora\]'"):
        check_lora(spec())
