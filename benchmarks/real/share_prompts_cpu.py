"""A group's prompt once (`trainer.share_prompts`) on the real model, on this CPU: the transformers trainer's GRPO
step and the reference model's pass over a batch of `experiment=gym_smollm2`, with and without sharing, timed side
by side in one process.

    python benchmarks/real/share_prompts_cpu.py --gguf $(bash launchers/fetch_smollm2.sh) \\
        --out benchmarks/results/real_cpu_share_prompts.json

The batch: --prompts held-out prompts of the experiment's tasks (reasoning-gym basic_arithmetic and chain_sum, one
solved example before each question, SmolLM2's chat template), 8 samples of each drawn by the native engine
(temperature 1, up to the experiment's 64 new tokens): real prompts and completions. SmolLM2-135M-Instruct in
float32 (this CPU has no native bf16), GRPO's loss with beta 0.04, grad_accum 1; advantages drawn at random (the
work of a step does not depend on them). Each repeat runs one step and one reference pass in each mode, the mode
that goes first alternating; medians over the repeats, every sample kept. The two modes' logprobs on the same
weights are compared too (they must agree up to rounding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from forge_exp.data.collate import pad_right  # noqa: E402
from forge_exp.data.reasoning_gym import ReasoningGymProblems  # noqa: E402
from forge_exp.generators.base import Sampling  # noqa: E402
from forge_exp.generators.native import NativeEngine  # noqa: E402
from forge_exp.models.generate import left_pad  # noqa: E402
from forge_exp.models.gguf import ensure_converted  # noqa: E402
from forge_exp.models.hf import Pretrained  # noqa: E402
from forge_exp.models.logprobs import sequence_logprobs  # noqa: E402
from forge_exp.rl.losses.grpo import GRPOLoss  # noqa: E402
from forge_exp.rl.types import TrainBatch  # noqa: E402
from forge_exp.trainers.hf import HFTrainer  # noqa: E402
from forge_exp.trainers.update import available_inputs  # noqa: E402

GROUP = 8


def make_batch(spec: Pretrained, prompts: int, seed: int = 0) -> tuple[TrainBatch, dict]:
    """`prompts` held-out prompts of experiment=gym_smollm2 and GROUP completions of each by the native engine."""
    dataset = OmegaConf.load(ROOT / "conf" / "experiment" / "gym_smollm2.yaml").dataset
    tokenizer = spec.tokenizer()
    source = ReasoningGymProblems(tasks=list(dataset.tasks), task_options=OmegaConf.to_container(dataset.task_options),
                                  eval_size=prompts, fewshot=dataset.fewshot)
    problems = source.eval_problems(tokenizer)[::len(dataset.tasks)][:prompts]  # the tasks in turn
    ids = [tokenizer(p.prompt)["input_ids"] for p in problems]
    with NativeEngine(spec, "cpu", seed=seed, slots=len(ids) * GROUP, max_len=max(map(len, ids)) + 64) as engine:
        groups = asyncio.run(engine.generate(ids, Sampling(n=GROUP, temperature=1.0,
                                                           max_new_tokens=dataset.max_new_tokens, seed=seed)))
    rows = [(p, g) for p, group in zip(ids, groups) for g in group]
    prompt_ids, prompt_mask = left_pad([p for p, _ in rows], tokenizer.pad_token_id or 0)
    response_ids, response_mask = pad_right([g.token_ids for _, g in rows], tokenizer.pad_token_id or 0)
    behaviour, _ = pad_right([g.logprobs for _, g in rows], 0.0, dtype=torch.float32)
    n = len(rows)
    g = torch.Generator().manual_seed(seed)
    batch = TrainBatch(prompt_ids, prompt_mask.bool(), response_ids, response_mask.bool(), behavior_logprobs=behaviour,
                       advantages=torch.randn(n, generator=g), truncated=torch.zeros(n, dtype=torch.bool),
                       policy_versions=torch.zeros(n, dtype=torch.long), ref_logprobs=behaviour.clone())
    sequences = [len(p) + sum(len(g.token_ids) for g in group) for p, group in zip(ids, groups)]  # shared: a prompt
    lengths = {"rows": n, "prompt_tokens": [len(p) for p in ids],  # and its group's responses, one sequence
               "response_tokens": [len(g.token_ids) for _, g in rows],
               "real_tokens": {"separate rows": sum(len(p) + len(g.token_ids) - 1 for p, g in rows),
                               "shared prompts": sum(sequences)},
               # the model's input tensor, padding included: [rows, P + R - 1], or [prompts, longest sequence]
               "tokens_a_forward": {"separate rows": n * (prompt_ids.shape[1] + response_ids.shape[1] - 1),
                                    "shared prompts": len(sequences) * max(sequences)}}
    return batch, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct's GGUF file (launchers/fetch_smollm2.sh)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    spec = Pretrained(path=str(ensure_converted(args.gguf)), dtype="float32")
    batch, lengths = make_batch(spec, args.prompts)
    print(json.dumps({k: lengths[k] for k in ("real_tokens", "tokens_a_forward")}), flush=True)
    trainers = {share: HFTrainer(spec, GRPOLoss(beta=0.04), device=torch.device("cpu"), lr=1e-6, weight_decay=0.0,
                                 loss_inputs=available_inputs(reference=True), share_prompts=share)
                for share in (False, True)}
    with torch.no_grad():  # the same weights, before any step: the two layouts' logprobs
        scores = {share: sequence_logprobs(trainers[False].model, batch.prompt_ids, batch.prompt_mask,
                                           batch.response_ids, batch.response_mask, share_prompts=share)[0]
                  for share in (False, True)}
    samples = {share: {"train_step_s": [], "reference_s": []} for share in (False, True)}
    for repeat in range(args.repeats + 1):  # the first: warm-up, not kept
        for share in ((False, True) if repeat % 2 else (True, False)):
            t = trainers[share]
            step = t.train_step(batch, grad_accum=1, max_grad_norm=1.0, temperature=1.0, mask_truncated=False)
            start = time.perf_counter()
            with torch.no_grad():
                sequence_logprobs(t.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                  batch.response_mask, share_prompts=share)
            if repeat:
                samples[share]["train_step_s"].append(step["train/seconds"])
                samples[share]["reference_s"].append(time.perf_counter() - start)
        print(json.dumps({str(k): {m: v[-1:] for m, v in s.items()} for k, s in samples.items()}), flush=True)
    table = {mode: {key: lengths[key][mode] for key in ("real_tokens", "tokens_a_forward")}
             for mode in ("separate rows", "shared prompts")}
    for share, s in samples.items():
        table["shared prompts" if share else "separate rows"].update({f"{m}_median": statistics.median(v)
                                                                      for m, v in s.items()})
    out = {
        "command": " ".join(["python", *sys.argv]),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "batch": lengths, "table": table,
        "speedup": {m: table["separate rows"][f"{m}_median"] / table["shared prompts"][f"{m}_median"]
                    for m in ("train_step_s", "reference_s")},
        "max_abs_logprob_diff": float((scores[True] - scores[False]).abs().max()),
        "samples": {("shared prompts" if k else "separate rows"): v for k, v in samples.items()},
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("table", "speedup", "max_abs_logprob_diff")}, indent=1))


if __name__ == "__main__":
    main()
