"""CPU against GPU on fixed small batches: the losses, the trainer's logprobs and one policy update, and the
generator's sampled tokens and behaviour logprobs give the same numbers on the GPU as on the CPU, within bf16
tolerance (METHOD.md: bf16 operands land between 1e-3 and 1e-2 in relative L2 error; float32 far under 1e-3).

    python benchmarks/gpu/parity.py [--model /tmp/gpubench/qwen3_1_7b] [--out parity.json]

The reference is always the CPU: float64 for the losses, float32 for the model. Every check is a relative L2 error
‖gpu − cpu‖ / ‖cpu‖ (or |Δ| / |cpu| for scalars) against a bound; the table is printed and the exit status
is 1 if any check fails. --model adds the real Qwen3-1.7B shape (teacher-forced logprobs, bf16 GPU vs float32 CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

FAMILIES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "reinforce")
FP32, BF16 = 1e-4, 2e-2  # bounds on relative error: float32 on the GPU, bf16 on the GPU


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 (b the reference); NaN anywhere is an infinite error."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


class Report:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, check: str, error: float, bound: float, **extra) -> None:
        self.rows.append({"check": check, "error": error, "bound": bound, "ok": error <= bound, **extra})

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)

    def table(self) -> str:
        lines = [f"{'check':72s} {'rel. error':>11s} {'bound':>8s}  ok"]
        for r in self.rows:
            lines.append(f"{r['check']:72s} {r['error']:11.2e} {r['bound']:8.0e}  {'yes' if r['ok'] else 'NO'}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- losses
def loss_inputs(device: torch.device, dtype: torch.dtype, B: int = 8, T: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logprobs = -3 * torch.rand(B, T, generator=g)
    lengths = torch.randint(16, T + 1, (B,), generator=g)
    inputs = {
        "logprobs": logprobs,
        "behavior_logprobs": logprobs + 0.2 * torch.randn(B, T, generator=g),
        "ref_logprobs": logprobs + 0.2 * torch.randn(B, T, generator=g),
        "advantages": torch.randn(B, 1, generator=g),
        "padding_mask": torch.arange(T)[None, :] < lengths[:, None],
        "entropy": 3 * torch.rand(B, T, generator=g),
    }
    inputs["old_logprobs"] = inputs["behavior_logprobs"]
    out = {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in inputs.items()}
    for k in ("logprobs", "entropy"):
        out[k].requires_grad_(True)
    return out


def build_family_loss(name: str):
    """`algorithm=<name>`'s loss as the run builds it (with an entropy bonus when the family has none, to check it)."""
    import dataclasses

    from forge_exp.config.compose import typed
    from forge_exp.runtime.build import build

    loss = typed([f"algorithm={name}", "dataset.max_new_tokens=64"]).algorithm.loss
    if loss.entropy_coef == 0:
        loss = dataclasses.replace(loss, entropy_coef=0.01)  # exercise the entropy term too
    return build(loss, "algorithm.loss")


def check_losses(report: Report, device: torch.device) -> None:
    from forge_exp.rl.losses import call_loss

    for name in FAMILIES:
        values = []
        for where, dt in ((torch.device("cpu"), torch.float64), (device, torch.float32)):
            inputs = loss_inputs(where, dt)
            loss, _ = call_loss(build_family_loss(name), **inputs)
            loss.backward()
            values.append((loss, inputs["logprobs"].grad))
        (loss_ref, grad_ref), (loss_gpu, grad_gpu) = values
        report.add(f"loss {name}: value, float32 GPU vs float64 CPU", rel(loss_gpu, loss_ref), FP32)
        report.add(f"loss {name}: d loss / d logprobs", rel(grad_gpu, grad_ref), FP32)


# ------------------------------------------------------------------------------------------------ small model
def small_model(seed: int = 0):
    from make_model import build_tokenizer, qwen3_1_7b_config
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = qwen3_1_7b_config(layers=2, hidden=256, intermediate=768)  # the real vocabulary and head shapes
    return Qwen3ForCausalLM(config).float().eval(), build_tokenizer()


def fixed_batch(B: int = 4, P: int = 24, R: int = 32, vocab: int = 151936):
    from forge_exp.rl.types import TrainBatch

    g = torch.Generator().manual_seed(1)
    plen = torch.randint(P // 2, P + 1, (B,), generator=g)
    rlen = torch.randint(R // 2, R + 1, (B,), generator=g)
    prompt_mask = torch.arange(P)[None, :] >= (P - plen)[:, None]
    response_mask = torch.arange(R)[None, :] < rlen[:, None]
    prompt_ids = torch.randint(0, vocab - 300, (B, P), generator=g).masked_fill(~prompt_mask, 151643)
    response_ids = torch.randint(0, vocab - 300, (B, R), generator=g).masked_fill(~response_mask, 151643)
    behavior = (-12 + torch.randn(B, R, generator=g)).masked_fill(~response_mask, 0.0)
    return TrainBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        behavior_logprobs=behavior, advantages=torch.randn(B, generator=g), truncated=torch.zeros(B, dtype=torch.bool),
        policy_versions=torch.zeros(B, dtype=torch.long), ref_logprobs=behavior + 0.1 * torch.randn(B, R, generator=g),
    )


def on(model, device, dtype):
    import copy

    return copy.deepcopy(model).to(device=device, dtype=dtype)


def logprobs_of(model, batch, device):
    from forge_exp.models.logprobs import sequence_logprobs

    with torch.no_grad():
        lp, ent = sequence_logprobs(
            model, batch.prompt_ids.to(device), batch.prompt_mask.to(device), batch.response_ids.to(device),
            batch.response_mask.to(device), 1.0,
        )
    return lp.cpu(), ent.cpu()


def check_model(report: Report, device: torch.device) -> None:
    from forge_exp.rl.losses import GRPOLoss
    from forge_exp.trainers.update import Policy, policy_update

    model, _ = small_model()
    batch = fixed_batch()
    lp_cpu, ent_cpu = logprobs_of(model, batch, "cpu")
    for dtype, bound in ((torch.float32, FP32), (torch.bfloat16, BF16)):
        tag = "float32" if dtype == torch.float32 else "bf16"
        lp, ent = logprobs_of(on(model, device, dtype), batch, device)
        report.add(f"trainer logprobs [4, 32], {tag} GPU vs float32 CPU", rel(lp, lp_cpu), bound)
        report.add(f"trainer entropy [4, 32], {tag} GPU vs float32 CPU", rel(ent, ent_cpu), bound)

    # one GRPO update (KL on, 2 micro-batches): loss, gradient norm, and for float32 the weight change itself
    results = []
    for where, dtype in (("cpu", torch.float32), (device, torch.float32), (device, torch.bfloat16)):
        m = on(model, where, dtype)
        before = [p.detach().float().cpu().clone() for p in m.parameters()]
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99))
        policy = Policy(torch.device(where), m, None, opt, GRPOLoss(beta=0.04))
        metrics = policy_update(policy, batch, grad_accum=2, max_grad_norm=1.0, temperature=1.0)
        delta = torch.cat([(p.detach().float().cpu() - b).flatten() for p, b in zip(m.parameters(), before)])
        results.append((dtype, metrics, delta))
    (_, ref_metrics, ref_delta), *on_device = results
    for dtype, metrics, delta in on_device:
        tag, bound = ("float32", FP32) if dtype == torch.float32 else ("bf16", BF16)
        for key in ("loss/total", "train/grad_norm"):
            err = abs(metrics[key] - ref_metrics[key]) / max(abs(ref_metrics[key]), 1e-12)
            report.add(f"policy_update {key}, {tag} GPU vs float32 CPU", err, bound)
        if dtype == torch.float32:
            report.add("policy_update weight change, float32 GPU vs float32 CPU", rel(delta, ref_delta), 1e-3)


def check_generator(report: Report, device: torch.device) -> None:
    """Sampling on the GPU (bf16, as the runs do), then the CPU scores the same tokens: the behaviour logprobs the
    generator returned must be the CPU's within bf16 tolerance. Greedy decoding in float32 must pick the CPU's
    argmax at every position, except where the CPU's top two logits are closer than 1e-3 (a tie either may break)."""
    from forge_exp.models.generate import generate
    from forge_exp.rl.types import TrainBatch

    model, tok = small_model()
    prompts = [torch.randint(0, 150000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (8, 12, 16, 20)]
    eos, pad = tok.eos_token_id, tok.pad_token_id

    def as_batch(outs):
        from forge_exp.data.collate import pad_right
        from forge_exp.models.generate import left_pad

        pids, pmask = left_pad(prompts, pad)
        rids, rmask = pad_right([o.token_ids for o in outs], pad)
        beh, _ = pad_right([o.logprobs for o in outs], 0.0, dtype=torch.float32)
        z = torch.zeros(len(outs))
        return TrainBatch(pids, pmask, rids, rmask, beh, z, z.bool(), z.long()), rmask

    gen = torch.Generator(device=device).manual_seed(0)
    outs = generate(
        on(model, device, torch.bfloat16), prompts, max_new_tokens=32, temperature=1.0, eos_id=eos, pad_id=pad,
        generator=gen,
    )
    batch, mask = as_batch(outs)
    lp_cpu, _ = logprobs_of(model, batch, "cpu")
    report.add("generator behaviour logprobs (sampled, bf16 GPU) vs float32 CPU",
               rel(batch.behavior_logprobs[mask], lp_cpu[mask]), BF16, tokens=int(mask.sum()))

    outs = generate(
        on(model, device, torch.float32), prompts, max_new_tokens=32, temperature=0.0, eos_id=eos, pad_id=pad
    )
    batch, mask = as_batch(outs)
    from forge_exp.models.generate import positions_from_mask

    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    full = torch.cat([batch.prompt_mask, batch.response_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=full, position_ids=positions_from_mask(full)).logits
    P = batch.prompt_ids.shape[1]
    pred = logits[:, P - 1 : -1]  # [B, R, V]: what the CPU predicts at each response position
    top2 = pred.topk(2, -1).values
    picked = pred.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    differs = (pred.argmax(-1) != batch.response_ids) & mask
    near_tie = (top2[..., 0] - picked) < 1e-3
    report.add("generator greedy tokens, float32 GPU vs CPU argmax (non-tie mismatches)",
               float((differs & ~near_tie).sum()), 0.0, positions=int(mask.sum()), ties=int((differs & near_tie).sum()))
    lp_cpu, _ = logprobs_of(model, batch, "cpu")
    report.add("generator greedy logprobs, float32 GPU vs float32 CPU",
               rel(batch.behavior_logprobs[mask], lp_cpu[mask]), FP32)


def check_real_shape(report: Report, device: torch.device, path: str) -> None:
    """Qwen3-1.7B's shape (the runs' model): teacher-forced logprobs of a fixed batch, bf16 GPU vs float32 CPU."""
    from forge_exp.models.hf import load_causal_lm

    model = load_causal_lm(path, "bfloat16").eval()
    batch = fixed_batch(B=2, P=32, R=32)
    lp_gpu, _ = logprobs_of(model.to(device), batch, device)
    lp_cpu, _ = logprobs_of(model.cpu().float(), batch, "cpu")
    report.add("Qwen3-1.7B shape: logprobs [2, 32], bf16 GPU vs float32 CPU", rel(lp_gpu, lp_cpu), BF16)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", help="HF dir of the real-shape model (benchmarks/gpu/make_model.py)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 must mean float32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    report = Report()
    check_losses(report, device)
    check_model(report, device)
    check_generator(report, device)
    if args.model:
        check_real_shape(report, device, args.model)
    print(report.table())
    print("parity:", "PASS" if report.ok else "FAIL")
    if args.out:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        record = {"device": name, "torch": torch.__version__, "ok": report.ok, "checks": report.rows}
        args.out.write_text(json.dumps(record, indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
