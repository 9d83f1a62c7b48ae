"""A reasoning-gym task's own verifier as a reward: the task's `score_answer(answer, entry)` on the answer the
response states (reasoning-gym, Open-Thought 2025: https://github.com/open-thought/reasoning-gym).

    answer:  the span of the first configured format the response uses (format.py: <answer>…</answer> by default;
             boxed, gsm8k, or full: the whole response), read after any </think>; none → score_answer(None) = 0
    score:   whatever the task's verifier returns, in [0, 1]: 1.0 exact (the accuracy counts these), some tasks
             give partial credit (the default verifier: len(oracle) / len(answer) when the oracle is inside it)

The entry (question, answer, metadata) travels in `Problem.info` and the task's name in `Problem.task`
(data/reasoning_gym.py), so one reward serves a mix of tasks. reasoning-gym is imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from forge_exp.rewards.format import after_thinking, check_formats, find_answer

if TYPE_CHECKING:
    from forge_exp.rl.types import Problem


class TaskScore:
    """`reward(prompt, response, target, problem=...) -> float`: the problem's task scores the stated answer.

    Args:
        formats: where to look for the answer, in order of preference (format.py).
        ignore_thinking: read the answer only after the last </think>; an unclosed <think> means no answer yet.
    """

    def __init__(self, formats: tuple[str, ...] | list[str] = ("answer",), ignore_thinking: bool = True):
        self.formats = check_formats(formats)
        self.ignore_thinking = ignore_thinking
        self._scorers: dict[str, Callable] = {}

    def answer(self, response: str) -> str | None:
        """The answer the response states, or None."""
        if self.ignore_thinking:
            if "<think>" in response and "</think>" not in response:
                return None  # cut off while still reasoning
            response = after_thinking(response)
        return find_answer(response, self.formats)

    def __call__(self, prompt: str, response: str, target: str, problem: Problem | None = None) -> float:
        if problem is None or not problem.task or not problem.info:
            raise ValueError("TaskScore scores reasoning-gym problems (dataset=reasoning_gym): this problem names "
                             "no task")
        return float(self.scorer(problem.task)(self.answer(response), problem.info))

    def scorer(self, task: str) -> Callable:
        if task not in self._scorers:
            from reasoning_gym import get_score_answer_fn

            self._scorers[task] = get_score_answer_fn(task)
        return self._scorers[task]
