"""The tool_arithmetic task: arithmetic a tiny model cannot do in its head (4-digit multiplication), with a
calculator tool it can learn to call — and the few demonstrations of a supervised warm start.

Problems are the synthetic arithmetic task's (`1234*5678=` -> `7006652`, held-out bucket disjoint from training;
forge_exp/data/arithmetic.py). Demonstrations are produced by playing a scripted agent through the real environment
and chat format, so they are tokenised exactly as the RL episodes are:

    <bos>1234*5678=  [1234*5678]<eos>  (7006652)  7006652<eos>
    prompt           model turn 1      tool        model turn 2        (loss on the model turns only)

A fraction `direct_fraction` of the demonstrations answers without the tool instead (`<bos>1234*5678=7006652<eos>`),
the way a model that was never taught the tool would: the warm-started policy then calls the tool only some of the
time, and RL has to learn when the tool pays (as well as to copy operands and results exactly).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from forge_exp.data.arithmetic import ArithmeticTask
from forge_exp.envs.calculator import CalculatorEnv
from forge_exp.envs.formats import ChatFormat
from forge_exp.rl.types import Problem


def tool_task(digits: int = 4, ops: str = "*", eval_size: int = 200) -> ArithmeticTask:
    return ArithmeticTask(digits=digits, ops=ops, eval_size=eval_size)


@dataclass(frozen=True)
class Demonstration:
    ids: list[int]  # prompt + every turn, as one sequence
    loss_mask: list[bool]  # True on the model's tokens


def demonstration(problem: Problem, tokenizer, chat_format: ChatFormat, use_tool: bool,
                  env: CalculatorEnv | None = None) -> Demonstration:
    """One scripted episode through `env` (a CalculatorEnv without a system prompt by default) and `chat_format`
    (the tiny format: the scripted call is written as `[expression]`)."""
    env = env or CalculatorEnv(system_prompt=None)
    ids = chat_format.prompt_ids(tokenizer, env.reset(problem), env.tools)
    mask = [False] * len(ids)
    eos = chat_format.stop_ids(tokenizer)[0]

    def model_turn(text: str) -> list[int]:
        turn = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        ids.extend(turn)
        mask.extend([True] * len(turn))
        return turn

    if use_tool:
        turn = model_turn(f"[{problem.question}]")
        result = env.step(chat_format.parse(tokenizer, turn))
        inserted = chat_format.env_ids(tokenizer, result.messages)
        ids.extend(inserted)
        mask.extend([False] * len(inserted))
    model_turn(problem.target)
    return Demonstration(ids, mask)


def demonstrations(problems: list[Problem], tokenizer, chat_format: ChatFormat, *, direct_fraction: float, seed: int,
                   make_env=None) -> list[Demonstration]:
    """Each problem demonstrated once (give training problems, never held-out ones); a `direct_fraction` of them
    answered without the tool. `make_env()` builds the environment each one plays through."""
    if not 0 <= direct_fraction <= 1:
        raise ValueError(f"direct_fraction must be in [0, 1], got {direct_fraction}")
    rng = random.Random(seed)
    return [demonstration(p, tokenizer, chat_format, use_tool=rng.random() >= direct_fraction,
                          env=make_env() if make_env else None) for p in problems]


def warmstart_inputs(items: list, seed: int) -> dict:
    """What models.warmstart.warmstart takes for a warm start on `items`: problems as they are (one answer each),
    or demonstrations (whole episodes, loss on the model's turns) in endless reshuffled passes."""
    if items and isinstance(items[0], Demonstration):
        return {"problems": cycle(items, seed), "collate": collate_demonstrations}
    return {"problems": items}


def cycle(demos: list[Demonstration], seed: int) -> Iterator[Demonstration]:
    """Endless reshuffled passes over a fixed set of demonstrations."""
    rng = random.Random(seed)
    order = list(demos)
    while True:
        rng.shuffle(order)
        yield from order


def collate_demonstrations(demos: list[Demonstration], tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(ids [B, T], attention_mask [B, T] bool, loss_mask [B, T] bool)`, right-padded: the layout of
    models.warmstart.collate_sft, so warmstart(..., collate=collate_demonstrations) trains on them."""
    width = max(len(d.ids) for d in demos)
    ids = torch.full((len(demos), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(demos), width), dtype=torch.bool)
    loss_mask = torch.zeros((len(demos), width), dtype=torch.bool)
    for i, d in enumerate(demos):
        ids[i, : len(d.ids)] = torch.tensor(d.ids)
        mask[i, : len(d.ids)] = True
        loss_mask[i, : len(d.ids)] = torch.tensor(d.loss_mask)
    return ids, mask, loss_mask
