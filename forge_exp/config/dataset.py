"""Schema of the `dataset` config group: where prompts and targets come from (conf/dataset/*.yaml).

    source=arithmetic            the synthetic task (forge_exp/data/arithmetic.py): digits, ops, eval_size
    source=hf                    a Hub dataset: path=openai/gsm8k, subset=main, split/eval_split
    source=jsonl | parquet       local files: path=data/{split}.jsonl ({split} → split / eval_split)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # the schema stays importable without torch
    from forge_exp.rl.types import Problem

SOURCES = ("arithmetic", "hf", "jsonl", "parquet")
TARGET_FORMATS = ("gsm8k", "boxed", "raw")  # see forge_exp/data/hf.py:extract_target
ARITHMETIC_OPS = "+-*"


@dataclass
class DatasetConfig:
    name: str = "arithmetic"
    source: str = "arithmetic"  # one of SOURCES
    path: Optional[str] = None  # hub id (source=hf) or local file, may contain {split} (jsonl, parquet)
    subset: Optional[str] = None  # hub config name, e.g. "main" for openai/gsm8k (source=hf only)
    split: str = "train"
    eval_split: Optional[str] = "test"  # held-out split; null = no eval set
    eval_size: Optional[int] = 200  # eval problems (the first N rows); null = the whole eval split; 0 = none
    streaming: bool = False  # read the Hub / files lazily instead of loading them (large datasets)
    shuffle_buffer: int = 1000  # streaming only: rows held for shuffling
    question_key: str = "question"  # row field with the question
    answer_key: str = "answer"  # row field the target is extracted from
    target_format: str = "raw"  # gsm8k: after '####' | boxed: last \boxed{} of a solution | raw: as is
    system_prompt: str = "think_answer"  # preset in data/prompts.py (think_answer, boxed, none) or literal text
    use_chat_template: bool = True  # the tokenizer's chat template; false: plain "User: ... Assistant:"
    max_prompt_tokens: int = 512  # longer prompts are skipped, not truncated
    max_new_tokens: int = 512  # response budget the generator samples up to
    seed: int = 0  # train order (reshuffled per epoch) and the arithmetic task's problems
    # the synthetic arithmetic task (source=arithmetic), read by forge_exp/data/arithmetic.py; its held-out set
    # has eval_size problems
    digits: int = 2  # digits per operand
    ops: str = "+"  # operators to draw from, any of "+-*/"

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"dataset.source must be one of {SOURCES}, got {self.source!r}")
        if self.target_format not in TARGET_FORMATS:
            raise ValueError(f"dataset.target_format must be one of {TARGET_FORMATS}, got {self.target_format!r}")
        for key in ("max_prompt_tokens", "max_new_tokens", "shuffle_buffer"):
            if getattr(self, key) < 1:
                raise ValueError(f"dataset.{key} must be >= 1, got {getattr(self, key)}")
        if self.eval_size is not None and self.eval_size < 0:
            raise ValueError(f"dataset.eval_size must be >= 0 or null (the whole eval split), got {self.eval_size}")
        if not self.split:
            raise ValueError("dataset.split must name a split, e.g. train")
        if self.source == "arithmetic":
            self._check_arithmetic()
        else:
            self._check_files()

    def _check_arithmetic(self) -> None:
        if not 1 <= self.digits <= 18:
            raise ValueError(f"dataset.digits must be in [1, 18], got {self.digits}")
        if not self.ops or any(op not in ARITHMETIC_OPS for op in self.ops):
            raise ValueError(f"dataset.ops must be a non-empty string of operators from {ARITHMETIC_OPS!r}, "
                             f"got {self.ops!r}")
        if self.eval_size is None:
            raise ValueError("dataset.eval_size must be a number for source=arithmetic (the held-out set size)")

    def _check_files(self) -> None:
        if not self.path:
            example = "openai/gsm8k" if self.source == "hf" else f"data/{{split}}.{self.source}"
            raise ValueError(f"dataset.path is required when dataset.source={self.source} (e.g. {example})")
        for key in ("question_key", "answer_key"):
            if not getattr(self, key):
                raise ValueError(f"dataset.{key} must name a field of the rows")
        if self.source == "hf":
            return
        if self.subset is not None:
            raise ValueError(f"dataset.subset is for Hub datasets (source=hf); with source={self.source} "
                             f"put the file in dataset.path and set subset to null")
        if self.eval_split is not None and "{split}" not in self.path:
            raise ValueError(
                f"dataset.eval_split={self.eval_split!r} needs a {{split}} placeholder in dataset.path "
                f"(e.g. data/{{split}}.{self.source}) to find the eval file; got {self.path!r}. "
                f"Set dataset.eval_split=null to train without an eval set"
            )


def build_dataset(cfg: DatasetConfig, tokenizer: Any) -> tuple[Callable[..., Iterator[Problem]], list[Problem]]:
    """(train iterator factory, eval problems). `train_iter_factory()` yields Problems without end, reshuffled
    every epoch; `eval_problems` is a fixed held-out list."""
    if cfg.source == "arithmetic":
        from forge_exp.data.arithmetic import ArithmeticTask

        task = ArithmeticTask(digits=cfg.digits, ops=cfg.ops, heldout_size=cfg.eval_size)
        return (lambda: task.train_stream(cfg.seed)), task.heldout()
    from forge_exp.data import hf

    return hf.build(cfg, tokenizer)
