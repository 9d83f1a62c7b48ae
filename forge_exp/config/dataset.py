"""Schemas of the `dataset` group (conf/dataset/*.yaml): where prompts and targets come from, built through
`_target_` into a problem source with `problems(tokenizer) -> (train stream factory, eval problems)`:

    arithmetic       the synthetic task (data/arithmetic.py: ArithmeticTask)
    gsm8k, math      a Hub dataset (data/hf.py: HubProblems), from the local datasets cache when offline
    jsonl, parquet   local files (data/hf.py: FileProblems): dataset.train_path=..., dataset.eval_path=...
    reasoning_gym    procedural tasks with their own verifiers (data/reasoning_gym.py: ReasoningGymProblems)

Every dataset says how long responses may be (`max_new_tokens`: the generator's budget, DAPO's L_max, Dr. GRPO's
horizon) — a property of the task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from forge_exp.checks import FieldError, at_least, not_empty, seed
from forge_exp.choices import BadRows, TargetFormat
from forge_exp.data.prompts import PLAIN_TEMPLATE


@dataclass
class DatasetBase:
    _target_: str = "forge_exp.data.arithmetic.ArithmeticTask"
    name: str = "dataset"
    max_new_tokens: int = 512  # response budget the generator samples up to
    eval_size: Optional[int] = None  # held-out problems (the first N rows); null = the whole eval split; 0 = none
    seed: int = 0  # train order (reshuffled per epoch); the arithmetic task's problems

    def __post_init__(self) -> None:
        at_least("max_new_tokens", self.max_new_tokens, 1)
        seed("seed", self.seed)
        if self.eval_size is not None:
            at_least("eval_size", self.eval_size, 0, "null = the whole eval split, 0 = none")


@dataclass
class ArithmeticDataset(DatasetBase):
    name: str = "arithmetic"
    max_new_tokens: int = 8
    eval_size: Optional[int] = 200
    digits: int = 2  # digits per operand
    ops: str = "+"  # operators to draw from, any of "+-*/"

    @property
    def prompt_budget(self) -> int:
        """Tokens a prompt may take: <bos>, two operands, the operator and '='."""
        return 2 * self.digits + 3

    def __post_init__(self) -> None:
        super().__post_init__()
        from forge_exp.data.arithmetic import OPS, max_eval_size

        if not 1 <= self.digits <= 18:
            raise FieldError("digits", f"must be in [1, 18], got {self.digits}")
        if not self.ops or any(op not in OPS for op in self.ops) or len(set(self.ops)) != len(self.ops):
            raise FieldError("ops", f"must be distinct operators of {OPS!r}, got {self.ops!r}")
        if self.eval_size is None:
            raise FieldError("eval_size", "must be a number for the arithmetic task (the held-out set size)")
        if self.eval_size > max_eval_size(self.digits, self.ops):
            raise FieldError("eval_size", f"must be <= {max_eval_size(self.digits, self.ops)} for digits="
                                          f"{self.digits}, ops={self.ops!r}, got {self.eval_size}")


@dataclass
class PromptedDataset(DatasetBase):
    """Questions formatted into prompts: the tokenizer's chat template with a system prompt, or a plain template
    (data/prompts.py)."""

    system_prompt: str = "think_answer"  # preset in data/prompts.py (think_answer, boxed, answer, none) or text
    use_chat_template: Optional[bool] = None  # null: the tokenizer's chat template when it has one
    template: str = PLAIN_TEMPLATE  # without a chat template: the text around {question}
    max_prompt_tokens: int = 512  # longer prompts are skipped, not truncated

    @property
    def prompt_budget(self) -> int:
        return self.max_prompt_tokens

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("max_prompt_tokens", self.max_prompt_tokens, 1)
        if "{question}" not in self.template:
            raise FieldError("template", f"must contain a {{question}} placeholder, got {self.template!r}")


@dataclass
class RowDataset(PromptedDataset):
    """Rows with a question field and an answer field (data/hf.py: RowProblems)."""

    question_key: str = "question"  # row field with the question
    answer_key: str = "answer"  # row field the target is extracted from
    target_format: TargetFormat = TargetFormat.raw  # gsm8k: after '####' | boxed: last \boxed{} | raw: as is
    streaming: bool = False  # read lazily instead of loading (large datasets)
    shuffle_buffer: int = 1000  # streaming only: rows held for shuffling
    # a row whose fields are wrong (missing, null, empty, a list answer, characters the tokenizer lacks), found as
    # the stream reaches it: fail the run naming file and row, or skip it (counted in data/bad_rows, first ones logged)
    bad_rows: BadRows = BadRows.fail

    def __post_init__(self) -> None:
        super().__post_init__()
        not_empty("question_key", self.question_key)
        not_empty("answer_key", self.answer_key)
        at_least("shuffle_buffer", self.shuffle_buffer, 1)


@dataclass
class HubDataset(RowDataset):
    _target_: str = "forge_exp.data.hf.HubProblems"
    path: str = ""  # hub id, e.g. openai/gsm8k
    subset: Optional[str] = None  # hub config name, e.g. "main" for openai/gsm8k
    split: str = "train"
    eval_split: Optional[str] = "test"  # null = no eval set

    def __post_init__(self) -> None:
        super().__post_init__()
        not_empty("path", self.path, "openai/gsm8k")
        not_empty("split", self.split, "train")


@dataclass
class FileDataset(RowDataset):
    _target_: str = "forge_exp.data.hf.FileProblems"
    train_path: str = ""  # data/train.jsonl (jsonl, json or parquet; a glob matches several files)
    eval_path: Optional[str] = None  # data/test.jsonl; null = no eval set

    def __post_init__(self) -> None:
        super().__post_init__()
        not_empty("train_path", self.train_path, "data/train.jsonl")


@dataclass
class ReasoningGymDataset(PromptedDataset):
    """reasoning-gym tasks: one or a weighted mix, each with its own options; a held-out set per task from seeds
    the train stream never reaches (data/reasoning_gym.py). Task names and options are checked against
    reasoning-gym before any process starts (apps/preflight.py)."""

    _target_: str = "forge_exp.data.reasoning_gym.ReasoningGymProblems"
    name: str = "reasoning_gym"
    tasks: List[str] = field(default_factory=lambda: ["basic_arithmetic"])
    weights: Optional[List[float]] = None  # a task's share of the train stream; null = equal
    task_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # task → its own options
    eval_size: Optional[int] = 100  # held-out problems per task
    fewshot: int = 0  # solved examples of the task shown before each question
    fewshot_response: str = "<answer>{answer}</answer>"  # how an example answers; {answer} is its answer
    system_prompt: str = "answer"
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tasks:
            raise FieldError("tasks", "is empty: name at least one reasoning-gym task, e.g. [basic_arithmetic]")
        if len(set(self.tasks)) != len(self.tasks):
            raise FieldError("tasks", f"names a task twice: {list(self.tasks)}")
        if self.weights is not None and not all(math.isfinite(w) and w > 0 for w in self.weights):
            raise FieldError("weights", f"must be positive numbers, one per task, got {list(self.weights)}")
        if self.eval_size is None:
            raise FieldError("eval_size", "must be a number: held-out problems per task (0 = none)")
        at_least("fewshot", self.fewshot, 0)
        if "{answer}" not in self.fewshot_response:
            raise FieldError("fewshot_response", f"must contain an {{answer}} placeholder, got "
                                                 f"{self.fewshot_response!r}")


DATASET_SCHEMAS = {"arithmetic": ArithmeticDataset, "hub": HubDataset, "files": FileDataset,
                   "reasoning_gym": ReasoningGymDataset}
