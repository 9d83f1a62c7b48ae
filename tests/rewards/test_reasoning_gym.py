"""The reasoning-gym reward: the task's own verifier on the stated answer, reached through WeightedReward's
`problem` keyword and the config's builder."""

import pytest
import reasoning_gym

from forge_exp.rewards.combine import WeightedReward, score_group
from forge_exp.rewards.reasoning_gym import TaskScore
from forge_exp.rl.types import Problem


def problem(task="chain_sum", **options) -> Problem:
    entry = reasoning_gym.create_dataset(task, seed=3, size=1, **options)[0]
    return Problem(prompt="p", target=entry["answer"], question=entry["question"], task=task, info=entry)


def test_the_task_scores_the_answer_in_tags():
    p, score = problem(), TaskScore()
    assert score("p", f"The sum is <answer>{p.target}</answer>", p.target, p) == 1.0
    assert score("p", f"<answer> {int(p.target) + 1} </answer>", p.target, p) == 0.0
    assert score("p", f"The answer is {p.target}.", p.target, p) == 0.0  # not in the asked-for format
    assert score("p", f"<think>maybe 3</think><answer>{p.target}</answer>", p.target, p) == 1.0
    assert score("p", f"<think>still thinking <answer>{p.target}</answer>", p.target, p) == 0.0  # cut off


def test_partial_credit_is_the_tasks_own():
    p = problem("spell_backward")
    entry = p.info
    got = TaskScore()("p", f"<answer>{entry['answer']}x</answer>", p.target, p)
    assert got == reasoning_gym.get_score_answer_fn("spell_backward")(entry["answer"] + "x", entry)


def test_full_format_reads_the_whole_response():
    p = problem()
    assert TaskScore(formats=["full"])("p", f"  {p.target}\n", p.target, p) == 1.0
    assert TaskScore(formats=["boxed"])("p", f"so \\boxed{{{p.target}}}", p.target, p) == 1.0


def test_weighted_reward_passes_the_problem_only_to_functions_that_take_it():
    p, seen = problem(), []

    def plain(prompt, response, target):
        seen.append(target)
        return 0.5

    reward = WeightedReward({"correct": (TaskScore(), 1.0), "plain": (plain, 0.2)})
    totals, components, failures = score_group(reward, p, [f"<answer>{p.target}</answer>", "no"])
    assert totals == [pytest.approx(1.1), pytest.approx(0.1)] and failures == 0
    assert [c["correct"] for c in components] == [1.0, 0.0] and seen == [p.target, p.target]


def test_a_problem_without_a_task_is_a_counted_failure_not_a_crash():
    reward = WeightedReward({"correct": (TaskScore(), 1.0)})
    total, parts = reward("p", "<answer>1</answer>", "1", Problem("p", "1"))
    assert total == 0.0 and parts["failed/correct"] == 1.0
    assert "names no task" in reward.last_errors["correct"]
