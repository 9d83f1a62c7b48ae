"""What the TorchTitan trainer tests run on each rank of a real torch.distributed world (gloo, CPU): tiny Qwen3 and
Llama checkpoints built here, the batches, and a worker that trains 3 steps and records loss, gradients and weights
(full tensors, by HF name). A module of its own: spawned processes import it by name."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException
from transformers import LlamaConfig, LlamaForCausalLM

from forge_exp.models.generate import left_pad
from forge_exp.models.logprobs import sequence_logprobs
from forge_exp.models.tiny import qwen3
from forge_exp.rl.losses import GRPOLoss
from forge_exp.rl.types import TrainBatch

VOCAB = 96  # divisible by the TP degree: each TP rank holds an equal slice of the vocabulary
STEPS = 3
# AdamW's first steps are sign-like: every weight element moves ~LR per step, 0.5% of a 0.02-scale matrix (a norm
# weight of 1 moves 3e-4 over 3 steps), far above the 1e-5 tolerance. Not larger: AdamW divides each gradient
# element by its own magnitude, so in the few near-zero-gradient elements TP's different float32 summation order
# (~3e-7 relative in the gradients) becomes an update difference proportional to LR (at 1e-3 it reaches 8e-6 of a
# weight after one step and 1e-5 in the next steps' gradients).
LR = 1e-4
TEMPERATURE = 0.9


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    if family == "qwen3":  # tied embeddings, q/k norms
        return qwen3(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=128, max_position_embeddings=64, pad_id=0, bos_id=1, eos_id=2, seed=seed)
    config = LlamaConfig(  # untied head, Llama-3 RoPE scaling
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def make_batches(model: torch.nn.Module, n: int = STEPS, seed: int = 0, shared: bool = False) -> list[TrainBatch]:
    """Ragged prompts (left-padded) and responses (right-padded), behaviour and reference logprobs near the model's
    own (so the ratio is near 1 and both clip sides see traffic), one truncated row. `shared`: rows 0, 2 and 5 have
    one prompt, rows 1 and 4 another (a group's samples, not adjacent; a micro-batch of 3 rows splits them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompts = [torch.randint(3, VOCAB, (int(k),), generator=g).tolist() for k in (3, 6, 4, 5, 2, 6)]
        if shared:
            prompts = [prompts[k] for k in (0, 1, 0, 3, 1, 0)]
        responses = [torch.randint(3, VOCAB, (int(k),), generator=g).tolist() for k in (5, 2, 7, 4, 6, 3)]
        prompt_ids, prompt_mask = left_pad(prompts, 0)
        width = max(len(r) for r in responses)
        response_ids = torch.zeros(len(responses), width, dtype=torch.long)
        response_mask = torch.zeros(len(responses), width, dtype=torch.bool)
        for i, r in enumerate(responses):
            response_ids[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), True
        with torch.no_grad():
            lp, _ = sequence_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, TEMPERATURE)
        noise = lambda: 0.3 * torch.randn(lp.shape, generator=g)  # noqa: E731
        out.append(TrainBatch(
            prompt_ids, prompt_mask, response_ids, response_mask,
            behavior_logprobs=(lp + noise()) * response_mask, advantages=torch.randn(len(prompts), generator=g),
            truncated=torch.tensor([False, False, True, False, False, False]),
            policy_versions=torch.zeros(len(prompts), dtype=torch.long), ref_logprobs=(lp + noise()) * response_mask,
        ))
    return out


def saved_case(tmp: Path, family: str, shared: bool = False) -> dict:
    """A tiny model of `family` saved as an HF checkpoint under tmp, and its batches (make_batches)."""
    model = tiny_model(family, seed=3)
    model.save_pretrained(tmp / "hf")
    torch.save(make_batches(model, seed=5, shared=shared), tmp / "batches.pt")
    return {"tmp": tmp, "checkpoint": str(tmp / "hf"), "batches": str(tmp / "batches.pt"), "model": model}


def transformers_scores(batches: str, family: str = "qwen3", seed: int = 3) -> list[torch.Tensor]:
    """The transformers model's logprobs of each saved batch's responses (tiny_model(family, seed)'s weights)."""
    model = tiny_model(family, seed=seed)
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        return [sequence_logprobs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask, TEMPERATURE)[0]
                for b in torch.load(batches, weights_only=False)]


def loss_fn() -> GRPOLoss:
    return GRPOLoss(beta=0.04, entropy_coef=0.01)  # KL and entropy terms: every loss input carries a gradient


def train_and_record(trainer, batches: list[TrainBatch], grad_accum: int) -> list[dict]:
    """Per step: the step's metrics, and (rank 0) the full gradients and updated weights by HF name."""
    steps = []
    for batch in batches:
        metrics = trainer.train_step(batch, grad_accum=grad_accum, max_grad_norm=1.0, temperature=TEMPERATURE,
                                     mask_truncated=True)
        grads = {n: t.clone() for n, t in trainer.named_full_weights(grads=True)}
        weights = {n: t.clone() for n, t in trainer.named_full_weights()}
        steps.append({"metrics": metrics, "grads": grads, "weights": weights})
    return steps


def worker(rank: int, world: int, rendezvous: str, job: dict) -> None:
    """One rank: join the world, run `job["fn"]` (a name in this module) and save its result from rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        result = globals()[job["fn"]](**job["kwargs"])
        if rank == 0:
            torch.save(result, job["out"])
    except Exception:
        Path(f"{job['out']}.rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_world(world: int, tmp: Path, fn: str, **kwargs):
    """Run `fn(**kwargs)` on a gloo world of `world` fresh processes; rank 0's return value."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / f"{fn}-{world}-{os.getpid()}-{len(list(tmp.iterdir()))}.pt"
    rendezvous = str(out) + ".rdv"  # a file rendezvous: no port, so concurrent test runs cannot collide
    job = {"fn": fn, "kwargs": kwargs, "out": str(out)}
    try:
        mp.start_processes(worker, args=(world, rendezvous, job), nprocs=world, join=True, start_method="spawn")
    except ProcessException:
        errors = "\n".join(p.read_text() for p in tmp.glob(out.name + ".rank*.err"))
        raise AssertionError(f"a rank of the {world}-process world failed:\n{errors}") from None
    return torch.load(out, weights_only=False)


# --------------------------------------------------------------------------------------------------- jobs
def parity_job(checkpoint: str, batches: str, parallelism: str, grad_accum: int, **knobs) -> list[dict]:
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    d = degrees(parallelism, dist.get_world_size())
    trainer = TitanTrainer.from_pretrained(checkpoint, degrees=d, loss=loss_fn(), lr=LR, **knobs)
    return train_and_record(trainer, torch.load(batches, weights_only=False), grad_accum)


def frozen_job(checkpoint: str, batches: str, **knobs) -> dict:
    """A frozen engine in one process scoring each batch: its scores, and the token tensors' shapes its model was
    given for them (one forward a batch)."""
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    trainer = TitanTrainer.from_pretrained(checkpoint, degrees=degrees("single", 1), loss=None, lr=0.0, frozen=True,
                                           **knobs)
    shapes = []
    trainer.model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    scores = [trainer.score(b, TEMPERATURE) for b in torch.load(batches, weights_only=False)]
    return {"scores": scores, "shapes": shapes}


def train_shapes_job(checkpoint: str, batches: str, grad_accum: int, **knobs) -> list[tuple[int, ...]]:
    """The token tensors' shapes the model is given in one training step on the first batch (one a micro-batch)."""
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    trainer = TitanTrainer.from_pretrained(checkpoint, degrees=degrees("single", 1), loss=loss_fn(), lr=LR, **knobs)
    shapes = []
    trainer.model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    train_and_record(trainer, torch.load(batches, weights_only=False)[:1], grad_accum)
    return shapes


def save_job(checkpoint: str, batches: str, parallelism: str, out_dir: str, hf_dir: str, grad_accum: int) -> dict:
    """Save the loaded weights in HF format (the round trip), train one step, save DCP, train one more: the second
    step's result is what a resumed run must reproduce."""
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    trainer = TitanTrainer.from_pretrained(checkpoint, degrees=degrees(parallelism, dist.get_world_size()),
                                           loss=loss_fn(), lr=LR)
    batch_list = torch.load(batches, weights_only=False)
    trainer.save_hf(hf_dir)
    train_and_record(trainer, batch_list[:1], grad_accum)
    trainer.save(out_dir)
    return {"after_resume": train_and_record(trainer, batch_list[1:2], grad_accum)[0], "step": trainer.step}


def resume_job(checkpoint: str, batches: str, parallelism: str, dcp_dir: str, grad_accum: int) -> dict:
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    trainer = TitanTrainer(Path(checkpoint), degrees=degrees(parallelism, dist.get_world_size()), loss=loss_fn(),
                           lr=LR)
    trainer.load(dcp_dir)
    step = trainer.step
    return {"after_resume": train_and_record(trainer, torch.load(batches, weights_only=False)[1:2], grad_accum)[0],
            "step": step}


def reference_job(checkpoint: str, batches: str, parallelism: str) -> dict:
    """A frozen engine (trainer.hosts_reference's reference model) scoring each batch, beside a policy engine on
    the same weights that trains on them in between: what every rank returns, and whether the frozen one has any
    gradient or optimizer."""
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    d = degrees(parallelism, dist.get_world_size())
    reference = TitanTrainer.from_pretrained(checkpoint, degrees=d, loss=None, lr=0.0, frozen=True)
    policy = TitanTrainer.from_pretrained(checkpoint, degrees=d, loss=loss_fn(), lr=LR)
    scores = []
    for batch in torch.load(batches, weights_only=False):
        scores.append(reference.score(batch, TEMPERATURE))
        train_and_record(policy, [batch], 1)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, scores)
    return {"scores": scores, "every_rank": every, "optimizer": reference.optimizer,
            "trainable": [n for n, p in reference.model.named_parameters() if p.requires_grad]}


def reference_dtype_job(checkpoint: str, batches: str, parallelism: str) -> dict:
    """A frozen engine computing in bf16 beside a trainable one on the same weights (float32 masters, cast by FSDP2
    for each forward): both engines' scores of each batch, and the dtypes each stores (read before a forward, which
    leaves some of a trainable engine's modules holding their bf16 copies)."""
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    d = degrees(parallelism, dist.get_world_size())
    kw = dict(degrees=d, lr=0.0, param_dtype=torch.bfloat16)
    reference = TitanTrainer.from_pretrained(checkpoint, loss=None, frozen=True, **kw)
    policy = TitanTrainer.from_pretrained(checkpoint, loss=loss_fn(), **kw)
    stored = {name: sorted({str(p.dtype) for p in e.model.parameters()}) for name, e in [("frozen", reference),
                                                                                       ("policy", policy)]}
    scores = [(reference.score(b, TEMPERATURE), policy.score(b, TEMPERATURE))
              for b in torch.load(batches, weights_only=False)]
    return {"scores": scores, "stored": stored}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def assert_same_steps(got: list[dict], ref: list[dict], what: str, tol: float = 1e-5) -> None:
    """Loss (and the other step metrics), every gradient and every updated weight within `tol` relative."""
    assert len(got) == len(ref)
    for step, (g, r) in enumerate(zip(got, ref), 1):
        for key in ("loss/total", "loss/policy", "loss/kl", "loss/entropy", "policy/entropy", "train/grad_norm",
                    "mismatch/logp_diff_abs_mean", "mismatch/kl_k3", "mismatch/ratio_p50", "mismatch/ratio_max"):
            assert abs(g["metrics"][key] - r["metrics"][key]) <= tol * max(abs(r["metrics"][key]), 1e-3), (
                f"{what} step {step} {key}: {g['metrics'][key]} vs {r['metrics'][key]}"
            )
        assert g["grads"].keys() == r["grads"].keys() == g["weights"].keys()
        for name in r["grads"]:
            assert rel(g["grads"][name], r["grads"][name]) <= tol, f"{what} step {step} grad {name}"
            assert rel(g["weights"][name], r["weights"][name]) <= tol, f"{what} step {step} weight {name}"


def sync_job(checkpoint: str, batches: str, parallelism: str) -> dict:
    """Train a step on the sharded trainer, capture its weights on every rank, and on rank 0 load them into an HF
    model (the generator's side) by the same-process path and check the CPU-state path; float32 and bf16."""
    from transformers import AutoModelForCausalLM

    from forge_exp.runtime.sharded_weights import ShardedWeightPublisher
    from forge_exp.runtime.weight_sync import WeightReceiver
    from forge_exp.trainers.parallel import degrees
    from forge_exp.trainers.titan import TitanTrainer

    trainer = TitanTrainer.from_pretrained(checkpoint, degrees=degrees(parallelism, dist.get_world_size()),
                                           loss=loss_fn(), lr=LR)
    two = torch.load(batches, weights_only=False)[:2]
    train_and_record(trainer, two[:1], 1)
    full = {n: t.clone() for n, t in trainer.named_full_weights()}
    out = {"full": full}
    for dtype in (None, torch.bfloat16):
        publisher = ShardedWeightPublisher(trainer, dist.get_rank(), torch.device("cpu"), dtype)
        stats = publisher.capture()
        if dist.get_rank() != 0:
            continue
        generator = AutoModelForCausalLM.from_pretrained(checkpoint)  # the pre-step weights
        receiver = WeightReceiver(generator, torch.device("cpu"))
        transport = receiver.receive(publisher.publish(version=1))
        receiver.load()
        publisher.send_state = True  # what a generator in another process would receive
        state = publisher.publish(version=1).state
        out[str(dtype)] = {"stats": stats, "transport": transport,
                           "loaded": {n: p.detach().clone() for n, p in generator.named_parameters()},
                           "state": state, "views": len(publisher._views)}
    # a later version: one process copies from the parameters' own storage (checked against the stream once, above)
    train_and_record(trainer, two[1:], 1)
    publisher.capture()
    out["next"] = {"full": {n: t.clone() for n, t in trainer.named_full_weights(torch.bfloat16)}}
    if dist.get_rank() == 0:
        out["next"]["snapshot"] = {n: publisher.params[n].clone() for n in publisher.names}
    return out
