"""SFT data: rows → token ids with a loss mask on the assistant's tokens → packed training rows.

    rows (data/hf.py: jsonl, parquet, Hub; or the synthetic task) ─▶ Example(ids, targets) ─▶ packed SFTBatch

Row formats (the first that applies):
  conversation        {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]} (TRL's
                      conversational format), rendered with the tokenizer's chat template as it is. Every assistant
                      turn is a target, its end-of-turn token included.
  prompt/completion   dataset.question_key is the prompt, formatted exactly as GRPO formats it
                      (data/prompts.format_prompt: chat template or the plain template, dataset.system_prompt);
                      dataset.answer_key is the completion, taken as it is (a GSM8K answer keeps its worked solution
                      and "#### 42"). Ids: tokenizer(prompt) + tokenizer(completion) + <eos> — exactly what the
                      generator encodes and samples, so an SFT checkpoint starts RL on the prompts it learnt from.
  source=arithmetic   the synthetic task: prompt "37+48=", completion "85" (the warm start's data).

Assistant tokens of a conversation are found on characters: turn i spans from the end of the rendering of
messages[:i] with the generation prompt to the end of the rendering of messages[:i+1]; the fast tokenizer's offsets
map characters to tokens. That needs a template which renders a prefix of a conversation as a prefix of its text
(Qwen, Llama 3, Mistral and most others do); an error names the row when one does not.
If the last assistant turn holds no <eos> (a template whose turns end with another token), <eos> is appended to
it and trained on: the generator stops only at <eos>.

Packing (algorithm.packing): examples are laid end to end in rows of algorithm.max_seq_len tokens (greedy, in
order). Position ids restart at 0 for every example and no attention mask is passed: transformers then builds a
block-diagonal causal mask from the position ids (masking_utils.find_packed_sequence_indices, the same signal
flash-attention's varlen path uses), so no example attends to another. tests/apps/test_sft_data.py checks that a
packed row gives the same logits as each example alone. An example longer than max_seq_len is cut to it (counted
in `truncated`); one left without a target token is dropped (counted in `dropped`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jinja2 import TemplateError

MESSAGES_KEY = "messages"
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Example:
    ids: list[int]
    targets: list[bool]  # per token: the model is trained to produce it (an assistant token)


@dataclass
class SFTBatch:
    """Training rows. Packed: several examples per row, position ids restarting at each, attention_mask None.
    Unpacked: one example per row, right-padded, with an attention mask."""

    input_ids: torch.Tensor  # [B, T] long
    position_ids: torch.Tensor  # [B, T] long
    targets: torch.Tensor  # [B, T] bool, True where token t is trained on (predicted from token t-1)
    attention_mask: torch.Tensor | None  # [B, T] bool, or None for packed rows
    examples: int  # examples in the batch (a micro-batch from `split` keeps the whole batch's count)

    @property
    def num_targets(self) -> int:
        return int(self.targets.sum())

    def split(self, n: int) -> list[SFTBatch]:
        """n micro-batches of near-equal row counts (gradient accumulation)."""
        size = -(-self.input_ids.shape[0] // n)
        return [
            SFTBatch(
                self.input_ids[i : i + size], self.position_ids[i : i + size], self.targets[i : i + size],
                None if self.attention_mask is None else self.attention_mask[i : i + size],
                self.examples,
            )
            for i in range(0, self.input_ids.shape[0], size)
        ]

    def to(self, device: torch.device | str) -> SFTBatch:
        mask = None if self.attention_mask is None else self.attention_mask.to(device)
        return SFTBatch(self.input_ids.to(device), self.position_ids.to(device), self.targets.to(device), mask,
                        self.examples)


# ---------------------------------------------------------------------------------------------- encoding
def encode_prompt_completion(prompt: str, completion: str, tokenizer: Any) -> Example:
    """tokenizer(prompt) + tokenizer(completion) + <eos>; targets: the completion and <eos>."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return Example(prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids))


def encode_conversation(messages: Sequence[dict], tokenizer: Any, where: str = "conversation") -> Example:
    """The chat-template rendering of `messages`; targets: the tokens of every assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{where}: a '{MESSAGES_KEY}' row needs a tokenizer with a chat template, and this one has "
                         f"none ({getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}); use "
                         f"prompt/completion rows (dataset.question_key / dataset.answer_key) instead")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{where}: conversations need a fast tokenizer (for character offsets)")
    text = _render(tokenizer, messages, False, where)
    spans = _assistant_spans(tokenizer, messages, text, where)
    enc = tokenizer(text, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    targets = [b > a and any(s <= a < e for s, e in spans) for a, b in offsets]
    last = [i for i, (a, b) in enumerate(offsets) if b > a and spans[-1][0] <= a < spans[-1][1]]
    if last and tokenizer.eos_token_id not in {ids[i] for i in last}:  # the generator stops only at <eos>
        ids.insert(last[-1] + 1, tokenizer.eos_token_id)
        targets.insert(last[-1] + 1, True)
    return Example(ids, targets)


def _assistant_spans(tokenizer: Any, messages: Sequence[dict], text: str, where: str) -> list[tuple[int, int]]:
    """Character spans of the assistant turns in `text`: from the end of the generation prompt before the turn to
    the end of the turn's rendering (its end-of-turn token included)."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, where) if i else ""
        if not text.startswith(before):
            raise ValueError(f"{where}: the chat template does not render messages[:{i}] (with the generation "
                             f"prompt) as a prefix of the conversation, so assistant turn {i} cannot be located; "
                             f"use prompt/completion rows instead")
        upto = _render(tokenizer, messages[: i + 1], False, where)
        if text.startswith(upto) and len(upto) > len(before):
            spans.append((len(before), len(upto)))
            continue
        # Some templates render the last turn differently from the same turn inside a longer conversation (Qwen3
        # gives the last assistant turn an empty <think></think>): find the content itself, then its <eos>.
        content = m["content"].strip()
        found = text.find(content, len(before)) if content else -1
        if found < 0:
            raise ValueError(f"{where}: assistant turn {i} is not in the chat template's rendering of the "
                             f"conversation; use prompt/completion rows instead")
        end = found + len(content)
        eos = tokenizer.eos_token or ""
        if eos and text[end:].lstrip(" ").startswith(eos):
            end = text.index(eos, end) + len(eos)
        spans.append((len(before), end))
    if not spans:
        raise ValueError(f"{where}: no assistant message, nothing to train on")
    return spans


def _render(tokenizer: Any, messages: Sequence[dict], generation_prompt: bool, where: str) -> str:
    try:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    except TemplateError as err:
        raise ValueError(f"{where}: the chat template refused the conversation: {err}") from None
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    return text


def check_messages(messages: Any, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: '{MESSAGES_KEY}' must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: {MESSAGES_KEY}[{i}] must be {{'role': one of {ROLES}, 'content': str}}, "
                             f"got {str(m)[:120]!r}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def encode_row(row: dict, source: Any, tokenizer: Any, where: str) -> Example:
    """One dataset row (see the module docstring for the formats) as an Example; `source` (data/hf.py:
    RowProblems) names the fields and formats the prompt."""
    if row.get(MESSAGES_KEY) is not None:
        return encode_conversation(check_messages(row[MESSAGES_KEY], where), tokenizer, where)
    for key, field_name in ((source.question_key, "question_key"), (source.answer_key, "answer_key")):
        if row.get(key) is None:
            present = ", ".join(k for k, v in row.items() if v is not None)
            raise ValueError(f"{where}: no '{MESSAGES_KEY}' list and no {key!r} field (dataset.{field_name}); "
                             f"the row has: {present}")
    prompt = source.format(str(row[source.question_key]), tokenizer)
    return encode_prompt_completion(prompt, str(row[source.answer_key]), tokenizer)


# ---------------------------------------------------------------------------------------------- packing
@dataclass
class Packer:
    """Examples → SFTBatch of `rows` rows of `max_seq_len` tokens (packed) or one example per row (unpacked)."""

    max_seq_len: int
    rows: int
    pad_id: int
    packing: bool = True
    truncated: int = 0
    dropped: int = 0
    examples: int = 0

    def fit(self, ex: Example) -> Example | None:
        """Cut to max_seq_len; None (dropped) when nothing is left to train on. The first token of an example is
        never a target: nothing before it in its own sequence predicts it."""
        if len(ex.ids) > self.max_seq_len:
            self.truncated += 1
            ex = Example(ex.ids[: self.max_seq_len], ex.targets[: self.max_seq_len])
        targets = [False] + ex.targets[1:]
        if not any(targets):
            self.dropped += 1
            return None
        return Example(ex.ids, targets)

    def batches(self, examples: Iterable[Example]) -> Iterator[SFTBatch]:
        """Batches until `examples` runs out; the last one may hold fewer rows."""
        fitted = (f for f in map(self.fit, examples) if f is not None)
        rows = self._packed_rows(fitted) if self.packing else ([ex] for ex in fitted)
        while chunk := list(itertools.islice(rows, self.rows)):
            yield self.collate(chunk)

    def _packed_rows(self, examples: Iterable[Example]) -> Iterator[list[Example]]:
        row: list[Example] = []
        used = 0
        for ex in examples:
            if row and used + len(ex.ids) > self.max_seq_len:
                yield row
                row, used = [], 0
            row.append(ex)
            used += len(ex.ids)
        if row:
            yield row

    def collate(self, rows: list[list[Example]]) -> SFTBatch:
        width = self.max_seq_len if self.packing else max(len(ex.ids) for r in rows for ex in r)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        targets = torch.zeros((len(rows), width), dtype=torch.bool)
        real = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, row in enumerate(rows):
            col = 0
            for ex in row:
                n = len(ex.ids)
                ids[r, col : col + n] = torch.tensor(ex.ids)
                positions[r, col : col + n] = torch.arange(n)
                targets[r, col : col + n] = torch.tensor(ex.targets)
                real[r, col : col + n] = True
                col += n
            positions[r, col:] = torch.arange(width - col)  # padding: a sequence of its own, never a target
        self.examples += sum(len(r) for r in rows)
        return SFTBatch(ids, positions, targets, None if self.packing else real, sum(len(r) for r in rows))

    def metrics(self) -> dict[str, float]:
        return {"data/examples": self.examples, "data/truncated": self.truncated, "data/dropped": self.dropped}


def describe(batch: SFTBatch, tokenizer: Any, limit: int = 8) -> dict[str, list[str]]:
    """The first `limit` examples of a batch as text, and the part of each that is trained on — logged by the app
    so that the loss mask can be checked by eye in MLflow."""
    texts, targets = [], []
    for r in range(batch.input_ids.shape[0]):
        starts = (batch.position_ids[r] == 0).nonzero().flatten().tolist() + [batch.input_ids.shape[1]]
        for s, e in zip(starts, starts[1:]):
            mask = batch.targets[r, s:e]
            if not mask.any():  # the padding at the end of a row
                continue
            ids = batch.input_ids[r, s:e]
            texts.append(tokenizer.decode(ids.tolist()))
            targets.append(tokenizer.decode(ids[mask].tolist()))
            if len(texts) == limit:
                return {"text": texts, "target": targets}
    return {"text": texts, "target": targets}


# ---------------------------------------------------------------------------------------------- sources
@dataclass
class SFTData:
    """The train split as an endless stream of batches (reshuffled every epoch, seeded), the eval split as a list."""

    source: Any  # a problem source (data/arithmetic.py: ArithmeticTask, data/hf.py: RowProblems)
    tokenizer: Any
    max_seq_len: int
    rows: int
    packing: bool = True
    epoch: int = 0

    def __post_init__(self) -> None:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.packer = Packer(self.max_seq_len, self.rows, pad, self.packing)
        self.eval_packer = Packer(self.max_seq_len, self.rows, pad, self.packing)

    def train_batches(self, skip: int = 0) -> Iterator[SFTBatch]:
        """Endless; `skip` batches are dropped first (resuming at a step replays the same order)."""
        return itertools.islice(self.packer.batches(self._train_examples()), skip, None)

    def _train_examples(self) -> Iterator[Example]:
        src = self.source
        if not hasattr(src, "load"):  # the synthetic task: its problems are the examples
            stream, _ = src.problems(self.tokenizer)
            yield from (self._encode_problem(p) for p in stream())
            return
        where = src.location("train")
        rows = src.load("train", src.streaming)
        if src.streaming:  # a shuffle buffer instead of a permutation (rows are never all in memory)
            rows = rows.shuffle(seed=src.seed, buffer_size=src.shuffle_buffer)
        for self.epoch in itertools.count():
            if src.streaming:
                rows.set_epoch(self.epoch)
                numbered: Iterable[tuple[int, dict]] = enumerate(rows, start=1)
            else:
                order = list(range(len(rows)))
                random.Random(src.seed * 1_000_003 + self.epoch).shuffle(order)
                numbered = ((i + 1, rows[i]) for i in order)
            seen = 0
            for number, row in numbered:
                seen += 1
                yield encode_row(row, src, self.tokenizer, f"{where} row {number}")
            if not seen:
                raise ValueError(f"{where}: the train split has no rows")

    def eval_batches(self) -> list[SFTBatch]:
        """The first dataset.eval_size rows of the eval split (the task's held-out set for arithmetic)."""
        src = self.source
        if not hasattr(src, "load"):
            return list(self.eval_packer.batches(self._encode_problem(p) for p in src.eval_problems(self.tokenizer)))
        if not src.has_eval() or src.eval_size == 0:
            return []
        where = src.location("eval")
        rows = src.load("eval")
        count = len(rows) if src.eval_size is None else min(src.eval_size, len(rows))
        examples = (encode_row(rows[i], src, self.tokenizer, f"{where} row {i + 1}") for i in range(count))
        return list(self.eval_packer.batches(examples))

    def _encode_problem(self, problem: Any) -> Example:
        return encode_prompt_completion(problem.prompt, problem.target, self.tokenizer)

    def metrics(self) -> dict[str, float]:
        return {**self.packer.metrics(), "data/epoch": float(self.epoch)}


__all__ = [
    "Example", "MESSAGES_KEY", "Packer", "SFTBatch", "SFTData", "check_messages", "describe", "encode_conversation",
    "encode_prompt_completion", "encode_row",
]
