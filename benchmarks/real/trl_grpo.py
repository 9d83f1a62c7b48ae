"""TRL's GRPOTrainer on the run a forge-exp command describes: the peer of benchmarks/real.md's comparison.

    python benchmarks/real/trl_grpo.py --out trl.json [--max-train-seconds S] -- experiment=gym_smollm2 model.path=...

The forge-exp overrides after `--` are composed as `forge-exp` composes them (forge_exp.config.compose) and mapped
onto GRPOConfig, so both sides run the same model file, the same prompts in the same order (forge-exp's
reasoning-gym stream, its seeds), the same reward functions and weights (built by forge-exp's own builder), group
size, prompts per step, learning rate, beta, clip range, loss aggregation, advantage scaling, temperature and
response budget. TRL generates with transformers (no vLLM here), on-policy. Held-out greedy accuracy is measured on
forge-exp's held-out problems every `eval.every` steps, at the start and at the end, with the same scorer.

Writes --out (JSON): the mapped GRPOConfig, per step (training seconds so far, evaluation excluded; reward, kl,
entropy, mean completion length) and per evaluation (training seconds so far, accuracy overall and per task).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

# forge-exp as installed (its config groups are the package forge_exp.conf), not the source tree
from forge_exp.apps.preflight import resolve_model
from forge_exp.config.compose import typed
from forge_exp.config.enums import plain
from forge_exp.models.hf import load_tokenizer
from forge_exp.runtime.build import build, build_reward

LOSS_TYPES = {"seq_mean": "grpo", "token_mean": "bnpo"}  # forge-exp's loss_agg → TRL's loss_type
SCALE = {"group_norm": "group", "mean": "none"}  # forge-exp's advantage → TRL's scale_rewards


def grpo_config(cfg, out_dir: str, on_gpu: bool) -> GRPOConfig:
    a, loss = cfg.algorithm, cfg.algorithm.loss
    return GRPOConfig(
        output_dir=out_dir, use_cpu=not on_gpu, seed=cfg.seed, max_steps=cfg.steps,
        per_device_train_batch_size=a.prompts_per_step * a.group_size // a.grad_accum,
        gradient_accumulation_steps=a.grad_accum, num_generations=a.group_size,
        max_completion_length=cfg.dataset.max_new_tokens, learning_rate=a.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm, adam_beta2=0.99,
        beta=a.beta, epsilon=loss.clip_low, epsilon_high=loss.clip_high, temperature=a.temperature, top_p=a.top_p,
        top_k=0, loss_type=LOSS_TYPES[plain(loss.loss_agg)], scale_rewards=SCALE[plain(a.advantage)],
        mask_truncated_completions=a.overlong_filter, num_iterations=1, shuffle_dataset=False,
        bf16=on_gpu and plain(cfg.model.dtype) == "bfloat16", gradient_checkpointing=False, logging_steps=1,
        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )


class Clock(TrainerCallback):
    """Training seconds (evaluations excluded), held-out evaluations every `every` steps, a time budget."""

    def __init__(self, evaluate, every: int, max_train_seconds: float | None):
        self.evaluate, self.every, self.budget = evaluate, every, max_train_seconds
        self.t0, self.paused, self.steps, self.evals = 0.0, 0.0, [], []

    def train_seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def _eval(self, step: int, model) -> None:
        t = time.perf_counter()
        self.evals.append({"step": step, "train_seconds": self.train_seconds(), **self.evaluate(model)})
        self.paused += time.perf_counter() - t
        print(json.dumps(self.evals[-1]), flush=True)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.t0 = time.perf_counter()
        self._eval(0, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.steps.append({"step": state.global_step, "train_seconds": self.train_seconds()})
        if self.budget is not None and self.train_seconds() >= self.budget:
            control.should_training_stop = True
        elif self.every and state.global_step % self.every == 0 and state.global_step < args.max_steps:
            self._eval(state.global_step, model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._eval(state.global_step, model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-train-seconds", type=float, default=None, help="stop once training took this long")
    p.add_argument("--eval-batch", type=int, default=256)
    p.add_argument("overrides", nargs="*", help="the forge-exp run's overrides (after --)")
    args = p.parse_args()
    cfg = typed([o for o in args.overrides if not o.startswith("hydra.")])  # where forge-exp writes: not TRL's
    resolve_model(cfg)  # a .gguf becomes its cached HF folder, dtype auto is decided, as forge-exp does
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    tokenizer = load_tokenizer(cfg.model.path)
    train, heldout = build(cfg.dataset, "dataset").problems(tokenizer)
    stream = iter(train())
    problems = [next(stream) for _ in range(cfg.steps * cfg.algorithm.prompts_per_step)]
    reward = build_reward(cfg.reward)
    first = reward.names[0]  # the correctness function (forge-exp's convention: listed first)

    def reward_fn(prompts, completions, index, **_):
        return [reward(problems[i].prompt, c, problems[i].target, problems[i])[0] for c, i in zip(completions, index)]

    @torch.no_grad()
    def evaluate(model) -> dict:
        was_training = model.training
        model.eval()
        correct: dict[str, list[float]] = {}
        for start in range(0, len(heldout), args.eval_batch):
            batch = heldout[start:start + args.eval_batch]
            enc = tokenizer([q.prompt for q in batch], return_tensors="pt", padding=True).to(device)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=on_gpu and plain(cfg.model.dtype) == "bfloat16"):
                out = model.generate(**enc, max_new_tokens=cfg.dataset.max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            for q, text in zip(batch, texts):
                score = reward(q.prompt, text, q.target, q)[1][first]
                correct.setdefault(q.task or "all", []).append(float(score >= 1.0))
        model.train(was_training)
        flat = [c for values in correct.values() for c in values]
        return {"accuracy": statistics.fmean(flat), **{f"{t}/accuracy": statistics.fmean(v) for t, v in correct.items()}}

    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32, local_files_only=True)
    data = Dataset.from_dict({"prompt": [q.prompt for q in problems], "index": list(range(len(problems)))})
    config = grpo_config(cfg, tempfile.mkdtemp(prefix="trl-grpo-"), on_gpu)
    clock = Clock(evaluate, cfg.eval.every, args.max_train_seconds)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    logged = {h["step"]: h for h in trainer.state.log_history if "reward" in h}
    steps = [{**s, **{k: logged.get(s["step"], {}).get(key) for k, key in (
        ("reward", "reward"), ("kl", "kl"), ("entropy", "entropy"), ("length", "completions/mean_length"))}}
        for s in clock.steps]
    Path(args.out).write_text(json.dumps({
        "trl_config": {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool, type(None)))},
        "steps": steps, "evals": clock.evals, "device": torch.cuda.get_device_name() if on_gpu else "cpu",
    }, indent=1))


if __name__ == "__main__":
    main()
