"""TRL's GRPOTrainer, in one process, at the shape benchmarks/lean/compare.py measures forge-exp at: the same tiny
Qwen3 and character tokenizer (forge_exp/models/tiny.py's weights read by transformers' Qwen3ForCausalLM; nothing from the
Hub), the same arithmetic prompts and the same exact-answer reward.

    .venv-trl/bin/python benchmarks/lean/trl_grpo.py --steps 100 --timings /tmp/trl.json [--init DIR] [--threads 2]

Runs in the benchmark venv of benchmarks/lean/setup_trl.sh. forge_exp's pure modules are imported from the source
tree; nothing of Monarch, Hydra or MLflow is needed. --timings writes wall-clock timestamps (time.time()) of
process start, imports done, trainer built, each step's begin and end, training end and the last line of the
script, so the driver can split start-up, steps and shutdown the same way for both sides, and the median
milliseconds of GRPOTrainer's phases (`phases_ms`): generation and scoring, the loss's forward, the whole step.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # forge_exp's pure layers, from the source tree

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from forge_exp.data.arithmetic import ArithmeticTask  # noqa: E402
from forge_exp.models.tiny import TinyQwen3  # noqa: E402
from forge_exp.rewards.arithmetic import ExactAnswerReward  # noqa: E402

T_IMPORTS = time.time()
PHASES: dict[str, list[float]] = {}


def clock_phases() -> None:
    """Time GRPOTrainer's own methods: _generate_and_score_completions (rollouts and rewards), compute_loss (the
    policy forward and the loss), training_step (all of a step: rollouts, forward, backward; the optimizer step
    follows it)."""
    for name in ("_generate_and_score_completions", "compute_loss", "training_step"):
        fn = getattr(GRPOTrainer, name)

        def wrapper(self, *a, _fn=fn, _name=name, **k):
            t0 = time.perf_counter()
            try:
                return _fn(self, *a, **k)
            finally:
                PHASES.setdefault(_name, []).append(time.perf_counter() - t0)
        setattr(GRPOTrainer, name, wrapper)


class StepClock(TrainerCallback):
    """Wall-clock begin/end of every optimizer step (generation, reward and update all happen inside one)."""

    def __init__(self):
        self.begin: list[float] = []
        self.end: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin.append(time.time())

    def on_step_end(self, args, state, control, **kwargs):
        self.end.append(time.time())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--init", default=None, help="an HF-format dir of the tiny model (forge-exp's warm start)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timings", default=None, help="write the timestamps here (JSON)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock_phases()

    spec = TinyQwen3(path=args.init)  # conf/model/tiny.yaml's sizes are the builder's defaults
    tokenizer = spec.tokenizer()
    init = args.init
    if init is None:  # the fresh tiny model, written where transformers reads it
        init = tempfile.mkdtemp(prefix="trl-init-")
        spec.build("cpu").save_pretrained(init)
    # TRL trains a transformers model: the tiny model's checkpoint read by transformers' Qwen3ForCausalLM
    model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32, local_files_only=True)
    task = ArithmeticTask(digits=2, ops="+", eval_size=200, seed=args.seed)
    stream = task.train_stream()
    rows = [next(stream) for _ in range(args.steps * args.prompts)]
    data = Dataset.from_dict({"prompt": [r.prompt for r in rows], "target": [r.target for r in rows]})
    exact = ExactAnswerReward()

    def reward(prompts, completions, target, **_):
        return [exact(p, c, t) for p, c, t in zip(prompts, completions, target)]

    out = tempfile.mkdtemp(prefix="trl-grpo-")
    config = GRPOConfig(
        output_dir=out,
        use_cpu=True,
        seed=args.seed,
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts * args.group,  # completions per step
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,  # no reference model, as forge-exp's tiny default
        epsilon=0.2,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        loss_type="grpo",  # 1/G Σ_i 1/|o_i| Σ_t, forge-exp's loss_agg=seq_mean
        scale_rewards="group",
        shuffle_dataset=False,
        logging_steps=10,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=False,
        gradient_checkpointing=False,  # TRL turns it on by default; forge-exp's tiny model runs without it
    )
    clock = StepClock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[clock])
    t_built = time.time()
    trainer.train()
    t_trained = time.time()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    if args.timings:
        Path(args.timings).write_text(json.dumps({
            "process_start": T_START, "imports_done": T_IMPORTS, "trainer_built": t_built,
            "step_begin": clock.begin, "step_end": clock.end, "train_end": t_trained,
            "threads": torch.get_num_threads(), "reward_first_log": rewards[0] if rewards else None,
            "reward_last_log": rewards[-1] if rewards else None, "script_end": time.time(),
            "phases_ms": {k: round(sorted(v[10:] or v)[len(v[10:] or v) // 2] * 1e3, 2) for k, v in PHASES.items()},
        }))
    os.sys.stdout.flush()


if __name__ == "__main__":
    main()
