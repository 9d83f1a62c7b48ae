import asyncio
import re

import torch

from forge_exp.data.tool_arithmetic import collate_demonstrations, cycle, demonstration, demonstrations, tool_task
from forge_exp.envs import CalculatorEnv, EpisodeLimits, Sampling, TinyToolFormat, run_episodes
from forge_exp.models.tiny import TinyQwen3
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer
from forge_exp.models.warmstart import warmstart
from tests.envs.helpers import Scripted

TOK, FMT = build_char_tokenizer(TOOL_ALPHABET), TinyToolFormat()


def take(task, count: int, seed: int = 1) -> list:
    stream = task.train_stream(seed)
    return [next(stream) for _ in range(count)]


def test_demonstrations_are_tokenised_exactly_as_rl_episodes():
    """A scripted agent playing the same problem through the driver yields the demonstration's ids and mask."""
    task = tool_task(eval_size=10)
    problem = next(task.train_stream(0))
    demo = demonstration(problem, TOK, FMT, use_tool=True)

    def agent(context):
        return re.findall(r"\((\d+)\)", context)[-1] if context.endswith(")") else f"[{problem.question}]"

    groups = asyncio.run(run_episodes(lambda: CalculatorEnv(system_prompt=None), [problem], 1, Scripted(TOK, agent),
                                      TOK, FMT, Sampling(max_new_tokens=20), EpisodeLimits(3, 64)))
    c = groups[0].completions[0]
    assert demo.ids == c.prompt_ids + c.token_ids
    assert demo.loss_mask == [False] * len(c.prompt_ids) + c.loss_mask
    assert groups[0].correct == [True]
    direct = demonstration(problem, TOK, FMT, use_tool=False)
    assert TOK.decode(direct.ids) == f"<bos>{problem.prompt}{problem.target}<eos>"


def test_demonstration_set_mix_and_heldout_disjointness():
    task = tool_task(eval_size=50)
    demos = demonstrations(take(task, 200), TOK, FMT, direct_fraction=0.25, seed=0)
    with_tool = sum("[" in TOK.decode(d.ids) for d in demos)
    assert 120 < with_tool < 180  # about 75%
    heldout = {p.prompt for p in task.heldout()}
    assert not any(TOK.decode(d.ids).removeprefix("<bos>").split("=")[0] + "=" in heldout for d in demos)
    first_pass = [next(s) for s in [cycle(demos, 0)] for _ in range(200)]
    assert sorted(map(id, first_pass)) == sorted(map(id, demos))  # one pass shows each once


def test_warmstart_on_demonstrations_trains_the_model_turns_only():
    task = tool_task(eval_size=10)
    demos = demonstrations(take(task, 8), TOK, FMT, direct_fraction=0.0, seed=0)
    ids, mask, loss_mask = collate_demonstrations(demos, TOK)
    assert ids.shape == mask.shape == loss_mask.shape and torch.equal(loss_mask & ~mask, torch.zeros_like(mask))
    assert loss_mask.sum() < mask.sum()  # prompt and tool results are not trained on
    model = TinyQwen3(alphabet=TOOL_ALPHABET).build()
    metrics = warmstart(model, TOK, cycle(demos, 0), steps=30, lr=3e-3, batch_size=8, collate=collate_demonstrations)
    assert metrics["warmstart/steps"] == 30 and metrics["warmstart/loss"] < 2.0  # from ~3.2 (log 25) at init
