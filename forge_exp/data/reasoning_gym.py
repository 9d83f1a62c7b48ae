"""Procedural tasks with verifiers from reasoning-gym (https://github.com/open-thought/reasoning-gym; 100+
generators such as basic_arithmetic, chain_sum, leg_counting), as problems: an endless train stream that mixes the
tasks by weight, a held-out set per task, and optional solved examples shown before each question (few-shot).

    reasoning_gym.create_dataset(task, seed, size, **task_options) ─▶ entry {question, answer, metadata}
        ─▶ Problem(prompt: chat-formatted question, target: answer, task, info: entry)   (rewards/reasoning_gym.py
           scores a response with the task's own score_answer(answer, entry))

Seeds: a task's items come from datasets seeded inside its own range of the 32-bit seed space: the train stream
reads `base + k·CHUNK` for chunk k (CHUNK items each), the held-out set `base + HELDOUT`, the examples
`base + EXAMPLES`, with `base` a hash of (seed, task) below 2**31. Most generators make item i of a dataset from
`Random(dataset seed + i)`, so these are disjoint ranges of generator seeds (the train stream would need 2**28
items of one task to reach the held-out range). Small tasks still repeat a question under different seeds
("Calculate 2 + 3."), so a train item whose question is a held-out or example question is skipped and counted.

reasoning-gym is an optional dependency (`pip install 'forge-exp[gym]'`), imported when problems are made.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge_exp.data.prompts import PLAIN_TEMPLATE, format_prompt
from forge_exp.rl.types import Problem

log = logging.getLogger(__name__)

CHUNK = 10_000  # items per train dataset a task's stream reads (its seeds: base, base + CHUNK, ...)
HELDOUT = 2**28  # offset of a task's held-out dataset seed from its base
EXAMPLES = HELDOUT + 2**20  # offset of its few-shot examples' dataset seed
MAX_SKIPPED = 10_000  # items in a row left out before the stream says that nothing it makes can be used


def import_gym():
    """The reasoning_gym module, or a ValueError saying how to install it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("dataset=reasoning_gym needs reasoning-gym, which is not installed: pip install "
                         "'forge-exp[gym]'") from None
    return reasoning_gym


def check_tasks(tasks: Sequence[str], options: Mapping[str, Mapping[str, Any]],
                weights: Sequence[float] | None) -> None:
    """Every task exists, takes its options and accepts their values (its Config's own validation); one
    ValueError line naming the key otherwise."""
    import dataclasses
    import difflib

    registry = import_gym().factory.DATASETS
    names = sorted(n for n in registry if n != "composite")
    for task in tasks:
        if task not in names:
            close = difflib.get_close_matches(task, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(names)} tasks: {', '.join(names)})"
            raise ValueError(f"dataset.tasks: {task!r} is not a reasoning-gym task{hint}")
    for task, opts in options.items():
        if task not in tasks:
            raise ValueError(f"dataset.task_options.{task}: {task!r} is not one of dataset.tasks ({', '.join(tasks)})")
        config_cls = registry[task][1]
        accepted = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
        for key in opts:
            if key not in accepted:
                close = difflib.get_close_matches(key, accepted, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(f"dataset.task_options.{task}.{key}: {task} takes no option {key!r}; {hint}it takes: "
                                 f"{', '.join(accepted)}")
        try:
            config = config_cls(**dict(opts))
            if hasattr(config, "validate"):
                config.validate()
        except Exception as e:  # noqa: BLE001 — the task's own check (often a bare assert): its message, one line
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"dataset.task_options.{task}: {task} refuses {dict(opts)}: {why}") from None
    if weights is not None and len(weights) != len(tasks):
        raise ValueError(f"dataset.weights: {len(weights)} weights for {len(tasks)} tasks; give one per task "
                         f"(or null for equal weights)")


@dataclass(frozen=True)
class ReasoningGymProblems:
    """`problems(tokenizer)` → (an endless GymStream of train problems, the held-out problems of every task)."""

    tasks: Sequence[str] = ("basic_arithmetic",)
    weights: Sequence[float] | None = None  # per task; None = equal
    task_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # task → its Config's fields
    eval_size: int = 100  # held-out problems per task
    fewshot: int = 0  # solved examples of the task before each question
    fewshot_response: str = "<answer>{answer}</answer>"  # an example's response; {answer} is its answer
    system_prompt: str = "answer"  # preset in data/prompts.py or literal text; "none" for no system message
    use_chat_template: bool | None = None  # None: the tokenizer's chat template when it has one
    template: str = PLAIN_TEMPLATE  # without a chat template: the text around {question}
    max_prompt_tokens: int = 512  # longer prompts are skipped, not truncated
    seed: int = 0

    # --- the tasks' items -----------------------------------------------------------------------------------
    def base(self, task: str) -> int:
        """The start of the task's seed range (below 2**31, so every dataset seed fits 32 bits)."""
        digest = hashlib.blake2b(f"{self.seed}/{task}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % 2**31

    def dataset(self, task: str, offset: int, size: int):
        options = dict(self.task_options.get(task, {}))
        return import_gym().create_dataset(task, seed=self.base(task) + offset, size=size, **options)

    def check(self) -> None:
        """Every task exists and takes its options: a ValueError naming the key (apps/preflight.py)."""
        check_tasks(self.tasks, self.task_options, self.weights)

    # --- prompts --------------------------------------------------------------------------------------------
    def examples(self, task: str) -> list[tuple[str, str]]:
        if not self.fewshot:
            return []
        return [(e["question"], self.fewshot_response.format(answer=e["answer"]))
                for e in self.dataset(task, EXAMPLES, self.fewshot)]

    def make(self, task: str, entry: dict, tokenizer: Any, examples: list[tuple[str, str]]) -> Problem | None:
        """The entry as a Problem, or None when its prompt is longer than max_prompt_tokens."""
        prompt = format_prompt(entry["question"], tokenizer, self.system_prompt, self.use_chat_template,
                               self.template, examples)
        if tokenizer is not None and len(tokenizer(prompt)["input_ids"]) > self.max_prompt_tokens:
            return None
        return Problem(prompt=prompt, target=str(entry["answer"]), question=entry["question"], task=task,
                       info=entry)

    # --- the interface of every problem source (data/hf.py, data/arithmetic.py) ------------------------------
    def problems(self, tokenizer: Any) -> tuple[GymStream, list[Problem]]:
        heldout = self.eval_problems(tokenizer)
        return GymStream(self, tokenizer, heldout), heldout

    def eval_problems(self, tokenizer: Any) -> list[Problem]:
        """`eval_size` problems of every task, task by task, in their dataset's order."""
        out: list[Problem] = []
        if not self.eval_size:
            return out
        for task in self.tasks:
            examples = self.examples(task)
            made = [self.make(task, e, tokenizer, examples) for e in self.dataset(task, HELDOUT, self.eval_size)]
            kept = [p for p in made if p is not None]
            if len(kept) < len(made):
                log.warning("reasoning_gym %s: %d held-out prompts are longer than dataset.max_prompt_tokens=%d and "
                            "were left out", task, len(made) - len(kept), self.max_prompt_tokens)
            out += kept
        return out


class GymStream:
    """The train problems, endless: each draw picks a task by weight (seeded), then that task's next item.
    `factory()` starts at the beginning; `factory(draws, next_items)` resumes where `position` said a stream was
    (draws of the task picker, next item of each task); `skipped` counts items left out (a held-out or example
    question, a prompt over max_prompt_tokens)."""

    def __init__(self, source: ReasoningGymProblems, tokenizer: Any, heldout: list[Problem]):
        self.source, self.tokenizer = source, tokenizer
        self.reserved = {p.question for p in heldout}
        self.examples = {task: source.examples(task) for task in source.tasks}
        for pairs in self.examples.values():
            self.reserved |= {q for q, _ in pairs}
        self.position: tuple[int, list[int]] = (0, [0] * len(source.tasks))
        self.skipped = 0
        self._chunks: dict[tuple[str, int], Any] = {}

    def __call__(self, draws: int = 0, next_items: Sequence[int] | None = None) -> Iterator[Problem]:
        tasks = list(self.source.tasks)
        picker = random.Random(f"{self.source.seed}/mix")
        weights = list(self.source.weights) if self.source.weights else None
        for _ in range(draws):  # the picks a resumed stream had made
            picker.choices(tasks, weights)
        items = list(next_items) if next_items is not None else [0] * len(tasks)
        for draws in itertools.count(draws + 1):
            k = tasks.index(picker.choices(tasks, weights)[0])
            for skipped in itertools.count():
                problem = self._item(k, items[k])
                items[k] += 1
                if problem is not None:
                    break
                self.skipped += 1
                if skipped == MAX_SKIPPED:
                    raise ValueError(f"reasoning_gym {tasks[k]}: {MAX_SKIPPED} items in a row were held-out questions "
                                     f"or longer than dataset.max_prompt_tokens={self.source.max_prompt_tokens}: raise "
                                     f"it, or widen the task's options (dataset.task_options.{tasks[k]})")
            self.position = (draws, list(items))
            yield problem

    def _item(self, k: int, index: int) -> Problem | None:
        task = self.source.tasks[k]
        chunk, offset = divmod(index, CHUNK)
        if (task, chunk) not in self._chunks:
            self._chunks = {key: ds for key, ds in self._chunks.items() if key[0] != task}  # one chunk per task
            self._chunks[task, chunk] = self.source.dataset(task, chunk * CHUNK, CHUNK)
        entry = self._chunks[task, chunk][offset]
        if entry["question"] in self.reserved:
            return None
        return self.source.make(task, entry, self.tokenizer, self.examples[task])
