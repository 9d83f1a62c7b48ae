"""Problems from Hugging Face `datasets`: a Hub dataset (openai/gsm8k, MATH, ...) or a local jsonl / parquet file.

    rows (datasets.load_dataset) ─▶ (question, target), each row checked ─▶ Problem(formatted prompt, target, question)

- The train split is an endless iterator; each epoch is a fresh permutation seeded by (seed, epoch), so two runs
  with one seed see the same order. With `streaming`, rows are shuffled through a buffer (`IterableDataset.shuffle`
  + `set_epoch`) and never held in memory.
- The eval split is a fixed list: the first `eval_size` rows, in file order.
- Local files: `path` may hold a `{split}` placeholder (data/{split}.jsonl → data/train.jsonl, data/test.jsonl);
  without one the file is the train split and there is no eval split.
- Targets: "gsm8k" takes the text after the last `####` with thousands commas removed; "boxed" the last
  `\\boxed{}` of a worked solution (MATH); "raw" the answer field as it is.
- Prompts longer than `max_prompt_tokens` are skipped (counted in `skipped`), not truncated: a cut question has
  no right answer.
Row numbers in errors count from 1 (row N of a jsonl is its Nth non-empty line; in a shuffled stream, the Nth row
read).
"""

from __future__ import annotations

import glob
import itertools
import json
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from forge_exp.config.dataset import TARGET_FORMATS
from forge_exp.data.prompts import format_prompt
from forge_exp.rewards.format import find_boxed
from forge_exp.rl.types import Problem

if TYPE_CHECKING:
    from forge_exp.config.dataset import DatasetConfig

log = logging.getLogger(__name__)

LOCAL_BUILDERS = {"jsonl": "json", "parquet": "parquet"}  # source → datasets' packaged builder


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
        raise ValueError(f"dataset.target_format must be one of {TARGET_FORMATS}, got {target_format!r}")
    return target or None


def split_location(cfg: DatasetConfig, split: str) -> str:
    """What errors call a split: the local file it resolves to, or `hub_id[split]`."""
    if cfg.source in LOCAL_BUILDERS:
        return cfg.path.replace("{split}", split)
    return f"{cfg.path}[{split}]"


def load_rows(cfg: DatasetConfig, split: str, streaming: bool = False, cache_dir: str | None = None) -> Any:
    """`datasets.load_dataset` for one split: a `Dataset`, or an `IterableDataset` when streaming."""
    import datasets  # heavy; only here

    where = split_location(cfg, split)
    if cfg.source in LOCAL_BUILDERS:
        if not glob.glob(where):
            raise FileNotFoundError(
                f"dataset.path: {where} does not exist (dataset.path={cfg.path!r}, split {split!r}, "
                f"cwd {os.getcwd()})"
            )
        args: tuple = (LOCAL_BUILDERS[cfg.source],)
        kwargs: dict[str, Any] = {"data_files": where, "split": "train"}
    else:
        args, kwargs = (cfg.path, cfg.subset), {"split": split}
    try:
        return datasets.load_dataset(*args, streaming=streaming, cache_dir=cache_dir, **kwargs)
    except Exception as err:  # name the file or hub id, and for jsonl find the offending row
        if cfg.source == "jsonl":
            _diagnose_jsonl(where, cfg)
        raise RuntimeError(f"{where}: datasets.load_dataset failed: {type(err).__name__}: {err}") from err


def _diagnose_jsonl(where: str, cfg: DatasetConfig) -> None:
    """datasets cannot read a jsonl whose rows lack a key the others have (a bare KeyError); say which row."""
    for file in sorted(glob.glob(where)):
        with open(file, encoding="utf-8") as f:
            lines = (line for line in f if line.strip())
            for row_number, line in enumerate(lines, start=1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{file} row {row_number}: not valid JSON ({err})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{file} row {row_number}: expected a JSON object, got {type(row).__name__}")
                _check_row(row, file, row_number, cfg)


def _check_row(row: dict, where: str, row_number: int, cfg: DatasetConfig) -> tuple[str, str]:
    for key, field in ((cfg.question_key, "question_key"), (cfg.answer_key, "answer_key")):
        if row.get(key) is None:
            problem = f"key {key!r} is null" if key in row else f"missing key {key!r}"
            present = ", ".join(k for k, v in row.items() if v is not None)
            raise ValueError(f"{where} row {row_number}: {problem} (dataset.{field}); the row has: {present}")
    target = extract_target(row[cfg.answer_key], cfg.target_format)
    if target is None:
        expected = {"gsm8k": "'#### <answer>' line", "boxed": "\\boxed{...}"}.get(cfg.target_format, "text")
        raise ValueError(
            f"{where} row {row_number}: {cfg.answer_key!r} has no {expected} (dataset.target_format="
            f"{cfg.target_format}): {str(row[cfg.answer_key])[-120:]!r}"
        )
    return str(row[cfg.question_key]), target


def records(rows: Iterable[dict], where: str, cfg: DatasetConfig) -> Iterator[tuple[str, str]]:
    """(question, target) per row, each row checked."""
    for row_number, row in enumerate(rows, start=1):
        yield _check_row(row, where, row_number, cfg)


class ProblemMaker:
    """Formats a record into a Problem; None when its prompt is longer than `max_prompt_tokens`."""

    def __init__(self, cfg: DatasetConfig, tokenizer: Any):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.skipped = 0

    def __call__(self, question: str, target: str) -> Problem | None:
        prompt = format_prompt(question, self.tokenizer, self.cfg.system_prompt, self.cfg.use_chat_template)
        if self.tokenizer is not None and len(self.tokenizer(prompt)["input_ids"]) > self.cfg.max_prompt_tokens:
            self.skipped += 1
            return None
        return Problem(prompt=prompt, target=target, question=question)


class TrainProblems:
    """The train split as an endless stream of Problems. `factory()` starts at epoch 0, `factory(start_epoch=k)`
    resumes at epoch k; `epoch` is the epoch being read, `skipped` the prompts dropped as too long."""

    def __init__(self, cfg: DatasetConfig, make: ProblemMaker, rows: Any, where: str):
        self.cfg, self.make, self.rows, self.where = cfg, make, rows, where
        self.epoch = 0
        if not cfg.streaming:  # check every row now, before any process starts
            self.rows = list(records(rows, where, cfg))
            if not self.rows:
                raise ValueError(f"{where}: the train split has no rows")
        else:
            self.rows = rows.shuffle(seed=cfg.seed, buffer_size=cfg.shuffle_buffer)

    @property
    def skipped(self) -> int:
        return self.make.skipped

    def __call__(self, start_epoch: int = 0) -> Iterator[Problem]:
        for epoch in itertools.count(start_epoch):
            self.epoch = epoch
            produced = 0
            for question, target in self.epoch_records(epoch):
                problem = self.make(question, target)
                if problem is not None:
                    produced += 1
                    yield problem
            if produced == 0:
                raise ValueError(
                    f"{self.where}: no prompt fits in dataset.max_prompt_tokens={self.cfg.max_prompt_tokens} "
                    f"(or the split is empty); raise it or shorten dataset.system_prompt"
                )

    def epoch_records(self, epoch: int) -> Iterable[tuple[str, str]]:
        if self.cfg.streaming:
            self.rows.set_epoch(epoch)
            return records(self.rows, f"{self.where} (streamed, epoch {epoch})", self.cfg)
        order = list(range(len(self.rows)))
        random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
        return (self.rows[i] for i in order)


def build(
    cfg: DatasetConfig, tokenizer: Any, cache_dir: str | None = None
) -> tuple[Callable[..., Iterator[Problem]], list[Problem]]:
    """(train iterator factory, eval problems) for source "hf", "jsonl" or "parquet"."""
    make = ProblemMaker(cfg, tokenizer)
    train = TrainProblems(
        cfg, make, load_rows(cfg, cfg.split, cfg.streaming, cache_dir), split_location(cfg, cfg.split)
    )
    eval_problems: list[Problem] = []
    if cfg.eval_split is not None and cfg.eval_size != 0:
        where = split_location(cfg, cfg.eval_split)
        rows = load_rows(cfg, cfg.eval_split, cfg.streaming, cache_dir)
        if cfg.eval_size is not None:
            rows = itertools.islice(rows, cfg.eval_size)
        make_eval = ProblemMaker(cfg, tokenizer)
        eval_problems = [p for p in itertools.starmap(make_eval, records(rows, where, cfg)) if p is not None]
        if make_eval.skipped:
            log.warning("%s: %d eval prompts are longer than dataset.max_prompt_tokens=%d and were left out",
                        where, make_eval.skipped, cfg.max_prompt_tokens)
    return train, eval_problems
