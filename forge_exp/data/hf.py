"""Problems from Hugging Face `datasets`: a Hub dataset (openai/gsm8k, MATH, ...) or a local jsonl / parquet file.

    rows (datasets.load_dataset) ─▶ (question, target), each row checked ─▶ Problem(formatted prompt, target, question)

- The train split is an endless iterator; each epoch is a fresh permutation seeded by (seed, epoch), so two runs
  with one seed see the same order. With `streaming`, rows are shuffled through a buffer (`IterableDataset.shuffle`
  + `set_epoch`) and never held in memory.
- The eval split is a fixed list: the first `eval_size` rows, in file order.
- Local files: `train_path` and `eval_path` (jsonl, json or parquet by extension; a glob matches several files);
  without `eval_path` there is no eval split. Loaded by `datasets` where it can type them; streamed, or where it
  cannot (rows whose fields differ in type), read as they are (data/files.py) and checked row by row.
- Targets: "gsm8k" takes the text after the last `####` with thousands commas removed; "boxed" the last
  `\\boxed{}` of a worked solution (MATH); "raw" the answer field as it is.
- Prompts longer than `max_prompt_tokens` are skipped (counted in `skipped`), not truncated: a cut question has
  no right answer.
- Every row is checked as the stream reaches it (a loaded split: its fields when it is loaded, its prompt when it
  is drawn): a question that is not text, an answer that is a list or an object, a missing target, characters the
  tokenizer does not know. `bad_rows="fail"` (the default) stops with the file and the row; "skip" drops the row,
  counts it (`bad_rows`) and logs the first ones with file and row. A file that does not parse always fails.
Row numbers in errors count from 1 (row N of a jsonl is its Nth non-empty line; in a shuffled stream, the Nth row
read).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from forge_exp import choices
from forge_exp.data.files import array_after_white_space, data_files, file_rows
from forge_exp.data.prompts import PLAIN_TEMPLATE, format_prompt
from forge_exp.rewards.format import find_boxed
from forge_exp.rl.types import Problem

log = logging.getLogger(__name__)

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # extension → datasets' builder


def extract_target(answer: Any, target_format: str) -> str | None:
    """The reference answer in `answer` (a dataset field), or None when it is not there."""
    text = str(answer)
    if target_format == "gsm8k":
        head, sep, tail = text.rpartition("####")
        target = tail.strip().replace(",", "") if sep else ""
    elif target_format == "boxed":
        target = (find_boxed(text) or "").strip()
    elif target_format == "raw":
        target = text.strip()
    else:
        raise ValueError(f"dataset.target_format must be one of {choices.TARGET_FORMATS}, got {target_format!r}")
    return target or None


@dataclass(frozen=True)
class RowProblems:
    """Problems from rows with a question field and an answer field; where the rows are is the subclass's part.
    `problems(tokenizer)` → (train: an endless TrainProblems stream, eval: a fixed list)."""

    question_key: str = "question"  # row field with the question
    answer_key: str = "answer"  # row field the target is extracted from
    target_format: str = "raw"  # gsm8k | boxed | raw (extract_target)
    system_prompt: str = "think_answer"  # preset in data/prompts.py or literal text; "none" for no system message
    use_chat_template: bool | None = None  # None: the tokenizer's chat template when it has one
    template: str = PLAIN_TEMPLATE  # without a chat template: the text around {question}
    max_prompt_tokens: int = 512  # longer prompts are skipped, not truncated
    eval_size: int | None = None  # the first N eval rows; None = all; 0 = no eval set
    bad_rows: str = "fail"  # a row that fails its check: "fail" the run naming file and row, or "skip" it (counted)
    streaming: bool = False  # read lazily instead of loading (large datasets)
    shuffle_buffer: int = 1000  # streaming only: rows held for shuffling
    seed: int = 0  # train order, reshuffled per epoch

    # --- where the rows are (subclasses) ----------------------------------------------------------------------
    def location(self, split: str) -> str:
        """What errors call a split ("train" or "eval"): a file, or hub_id[split]."""
        raise NotImplementedError

    def has_eval(self) -> bool:
        raise NotImplementedError

    def _load_args(self, split: str) -> tuple[tuple, dict[str, Any]]:
        raise NotImplementedError

    # --- reading --------------------------------------------------------------------------------------------
    def load(self, split: str, streaming: bool = False, cache_dir: str | None = None) -> Any:
        """`datasets.load_dataset` for "train" or "eval": a `Dataset`, or an `IterableDataset` when streaming."""
        import datasets  # heavy; only here

        args, kwargs = self._load_args(split)
        try:
            return datasets.load_dataset(*args, streaming=streaming, cache_dir=cache_dir, **kwargs)
        except Exception as err:  # name the split
            raise RuntimeError(f"{self.location(split)}: datasets.load_dataset failed: {type(err).__name__}: {err}"
                               ) from err

    def format(self, question: str, tokenizer: Any) -> str:
        return format_prompt(question, tokenizer, self.system_prompt, self.use_chat_template, self.template)

    def problems(self, tokenizer: Any, cache_dir: str | None = None) -> tuple[TrainProblems, list[Problem]]:
        make = ProblemMaker(self, tokenizer, self.location("train"))
        train = TrainProblems(self, make, self.load("train", self.streaming, cache_dir), self.location("train"))
        return train, self.eval_problems(tokenizer, cache_dir)

    def eval_problems(self, tokenizer: Any, cache_dir: str | None = None) -> list[Problem]:
        """The held-out problems alone: the first eval_size rows of the eval split, in file order."""
        if not self.has_eval() or self.eval_size == 0:
            return []
        where = self.location("eval")
        rows = self.load("eval", self.streaming, cache_dir)
        if self.eval_size is not None:
            rows = itertools.islice(rows, self.eval_size)
        make = ProblemMaker(self, tokenizer, where)
        problems = [p for p in itertools.starmap(make, records(rows, where, self, make.bad)) if p is not None]
        if make.skipped:
            log.warning("%s: %d eval prompts are longer than dataset.max_prompt_tokens=%d and were left out",
                        where, make.skipped, self.max_prompt_tokens)
        return problems


@dataclass(frozen=True)
class HubProblems(RowProblems):
    """A Hub dataset by id (read from the local datasets cache when offline): conf/dataset/gsm8k.yaml, math.yaml."""

    path: str = ""  # hub id, e.g. openai/gsm8k (dataset.path: required, as config/dataset.py says)
    subset: str | None = None  # hub config name, e.g. "main" for openai/gsm8k
    split: str = "train"
    eval_split: str | None = "test"  # None = no eval set

    def _split(self, split: str) -> str:
        return self.split if split == "train" else self.eval_split

    def location(self, split: str) -> str:
        return f"{self.path}[{self._split(split)}]"

    def has_eval(self) -> bool:
        return self.eval_split is not None

    def _load_args(self, split: str) -> tuple[tuple, dict[str, Any]]:
        return (self.path, self.subset), {"split": self._split(split)}


@dataclass(frozen=True)
class FileProblems(RowProblems):
    """Local files (jsonl, json or parquet, by extension; a glob matches several): conf/dataset/jsonl.yaml."""

    train_path: str = ""  # e.g. data/train.jsonl (dataset.train_path: required, as config/dataset.py says)
    eval_path: str | None = None  # None = no eval set

    def location(self, split: str) -> str:
        return self.train_path if split == "train" else self.eval_path

    def has_eval(self) -> bool:
        return self.eval_path is not None

    def key(self, split: str) -> str:
        return "train_path" if split == "train" else "eval_path"

    def builder(self, split: str) -> str:
        path = self.location(split)
        ext = os.path.splitext(path)[1].lower()
        if ext not in FILE_BUILDERS:
            raise ValueError(f"dataset.{self.key(split)}={path}: unknown file type {ext or '(none)'}; use one of "
                             f"{', '.join(FILE_BUILDERS)}")
        return FILE_BUILDERS[ext]

    def load(self, split: str, streaming: bool = False, cache_dir: str | None = None) -> Any:
        """Loaded by `datasets` (typed, cached as Arrow) where it can; otherwise, and when streaming, the rows as
        they are in the file (data/files.py), each checked when reached (bad_rows): datasets refuses a .json array
        after white space, and rows whose fields differ in type (an answer that is an object in one row) fail its
        loading whole, or its stream half-way."""
        import datasets

        files = data_files(self.location(split), self.key(split))  # there, and files (not a pipe)
        if not streaming and not any(array_after_white_space(f) for f in files):
            try:
                return super().load(split, streaming, cache_dir)
            except RuntimeError:
                pass  # read below: the rows' own check names the one that is wrong, or skips it

        def rows():
            for file in files:
                yield from (row for _, row in file_rows(file, self.builder(split)))

        return datasets.IterableDataset.from_generator(rows) if streaming else list(rows())

    def _load_args(self, split: str) -> tuple[tuple, dict[str, Any]]:
        return (self.builder(split),), {"data_files": self.location(split), "split": "train"}


def check_row(row: dict, where: str, row_number: int, source: RowProblems) -> tuple[str, str]:
    """(question, target) of one row, or a ValueError naming the file, the row and the config key."""
    for key, field in ((source.question_key, "question_key"), (source.answer_key, "answer_key")):
        if row.get(key) is None:
            problem = f"key {key!r} is null" if key in row else f"missing key {key!r}"
            present = ", ".join(k for k, v in row.items() if v is not None)
            raise ValueError(f"{where} row {row_number}: {problem} (dataset.{field}); the row has: {present}")
    question, answer = row[source.question_key], row[source.answer_key]
    if not isinstance(question, str) or not question.strip():
        what = f"a {type(question).__name__}" if not isinstance(question, str) else "empty"
        raise ValueError(f"{where} row {row_number}: {source.question_key!r} is {what} (dataset.question_key); a "
                         f"question is text: {json.dumps(question)[:60]}")
    if not isinstance(answer, (str, int, float)):
        raise ValueError(f"{where} row {row_number}: {source.answer_key!r} is a {type(answer).__name__} "
                         f"(dataset.answer_key); an answer is text or a number: {json.dumps(answer)[:60]}")
    target = extract_target(row[source.answer_key], source.target_format)
    if target is None:
        expected = {"gsm8k": "'#### <answer>' line", "boxed": "\\boxed{...}"}.get(source.target_format, "text")
        raise ValueError(
            f"{where} row {row_number}: {source.answer_key!r} has no {expected} (dataset.target_format="
            f"{source.target_format}): {str(row[source.answer_key])[-120:]!r}"
        )
    return str(row[source.question_key]), target


def check_prompt(prompt: str, ids: list[int], tokenizer: Any) -> None:
    """A ValueError when the tokenizer turned part of the prompt into its unknown token: the model cannot read it."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids:
        raise ValueError(f"the prompt has characters the model's tokenizer does not know ({prompt[:60]!r}); for "
                         f"model=tiny write questions in digits and '+-*/= ', or set dataset.system_prompt / "
                         f"dataset.template")


class BadRows:
    """What `bad_rows` does with a row that fails its check: "fail" raises the row's error (file and row named),
    "skip" counts the row (once, however many epochs draw it) and logs the first LOGGED of them."""

    LOGGED = 20

    def __init__(self, policy: str):
        self.policy, self.rows = policy, set()

    @property
    def count(self) -> int:
        return len(self.rows)

    def found(self, error: ValueError, where: str, row_number: int) -> None:
        if self.policy != "skip":
            raise error
        if (where, row_number) in self.rows:
            return
        self.rows.add((where, row_number))
        if self.count <= self.LOGGED:
            log.warning("%s; the row is skipped (dataset.bad_rows=skip)%s", error,
                        "; further bad rows are only counted" if self.count == self.LOGGED else "")


def records(rows: Iterable[dict], where: str, source: RowProblems, bad: BadRows) -> Iterator[tuple[str, str, int]]:
    """(question, target, row number) per row, each row checked: a bad one fails or is skipped (BadRows)."""
    for row_number, row in enumerate(rows, start=1):
        try:
            question, target = check_row(row, where, row_number, source)
        except ValueError as e:
            bad.found(e, where, row_number)
            continue
        yield question, target, row_number


class ProblemMaker:
    """Formats a record into a Problem; None when its prompt is longer than `max_prompt_tokens` (counted in
    `skipped`) or has characters the tokenizer does not know and bad rows are skipped (counted in `bad.count`)."""

    def __init__(self, source: RowProblems, tokenizer: Any, where: str = ""):
        self.source, self.tokenizer, self.where = source, tokenizer, where
        self.bad = BadRows(source.bad_rows)
        self.skipped = 0

    def __call__(self, question: str, target: str, row_number: int = 0) -> Problem | None:
        prompt = self.source.format(question, self.tokenizer)
        if self.tokenizer is not None:
            ids = self.tokenizer(prompt)["input_ids"]
            try:
                check_prompt(prompt, ids, self.tokenizer)
            except ValueError as e:
                self.bad.found(ValueError(f"{self.where} row {row_number}: {e}"), self.where, row_number)
                return None
            if len(ids) > self.source.max_prompt_tokens:
                self.skipped += 1
                return None
        return Problem(prompt=prompt, target=target, question=question)


class TrainProblems:
    """The train split as an endless stream of Problems. `factory()` starts at epoch 0; `factory(epoch, offset)`
    resumes where `position` said a stream was: (the epoch being read, rows of it read so far); `skipped` counts
    the prompts dropped as too long."""

    def __init__(self, source: RowProblems, make: ProblemMaker, rows: Any, where: str):
        self.source, self.make, self.rows, self.where = source, make, rows, where
        self.epoch = 0
        self.position = (0, 0)
        if not source.streaming:  # check every row's fields now, as the service starts
            self.rows = list(records(rows, where, source, make.bad))
            if not self.rows:
                raise ValueError(f"{where}: the train split has no rows")
        else:
            self.rows = rows.shuffle(seed=source.seed, buffer_size=source.shuffle_buffer)

    @property
    def skipped(self) -> int:
        return self.make.skipped

    @property
    def bad_rows(self) -> int:
        return self.make.bad.count

    def __call__(self, start_epoch: int = 0, start_offset: int = 0) -> Iterator[Problem]:
        for epoch in itertools.count(start_epoch):
            self.epoch = epoch
            offset = start_offset if epoch == start_epoch else 0
            produced = 0
            for question, target, row_number in itertools.islice(self.epoch_records(epoch), offset, None):
                offset += 1
                self.position = (epoch, offset)
                problem = self.make(question, target, row_number)
                if problem is not None:
                    produced += 1
                    yield problem
            if produced == 0 and (epoch != start_epoch or start_offset == 0):
                bad = f"{self.bad_rows} bad rows skipped (dataset.bad_rows=skip), " if self.bad_rows else ""
                raise ValueError(
                    f"{self.where}: no usable row: {bad}no prompt fits in dataset.max_prompt_tokens="
                    f"{self.source.max_prompt_tokens} (or the split is empty); raise it or shorten "
                    f"dataset.system_prompt"
                )

    def epoch_records(self, epoch: int) -> Iterable[tuple[str, str, int]]:
        if self.source.streaming:  # a row is known by its place in this epoch's shuffled order
            self.rows.set_epoch(epoch)
            self.make.where = f"{self.where} (streamed, epoch {epoch})"
            return records(self.rows, self.make.where, self.source, self.make.bad)
        order = list(range(len(self.rows)))
        random.Random(self.source.seed * 1_000_003 + epoch).shuffle(order)
        return (self.rows[i] for i in order)
