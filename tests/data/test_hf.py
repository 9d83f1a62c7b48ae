"""HF `datasets` sources on local jsonl / parquet files written here with the real GSM8K and MATH schemas."""

import itertools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataclasses

from forge_exp.data import hf
from tests.data.test_prompts import make_tokenizer

GSM8K_TRAIN = [  # openai/gsm8k "main": question, answer (worked solution ending in "#### <number>")
    {"question": f"Tom has {n} apples and buys {n * 100} more. How many apples now?",
     "answer": f"He has {n} + {n * 100} = <<{n}+{n * 100}={n * 101}>>{n * 101} apples.\n#### {n * 101:,}"}
    for n in range(1, 11)
]
GSM8K_TEST = [
    {"question": "What is 6*7?", "answer": "6*7 = <<6*7=42>>42\n#### 42"},
    {"question": "What is 1000+234?", "answer": "#### 1,234"},
    {"question": "What is 2-3?", "answer": "#### -1"},
]
MATH_ROWS = [  # the MATH schema: problem, level, type, solution (answer in the last \boxed{})
    {"problem": "Compute $\\frac{1}{4}+\\frac{1}{4}$.", "level": "Level 1", "type": "Prealgebra",
     "solution": "We add: $\\frac{1}{4}+\\frac{1}{4} = \\boxed{\\frac{1}{2}}$."},
    {"problem": "Find $x$ if $x^2=4$ and $x<0$.", "level": "Level 2", "type": "Algebra",
     "solution": "So $x = \\boxed{-2}$."},
]


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """datasets writes caches and lock files under ~/.cache unless told otherwise."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def config(tmp_path, **overrides) -> hf.FileProblems:
    fields = dict(train_path=str(tmp_path / "train.jsonl"), eval_path=str(tmp_path / "test.jsonl"),
                  target_format="gsm8k", system_prompt="none", use_chat_template=False, eval_size=None)
    return hf.FileProblems(**{**fields, **overrides})


def build(source: hf.RowProblems, tokenizer, cache_dir=None):
    return source.problems(tokenizer, cache_dir=cache_dir)


@pytest.fixture
def gsm8k_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", GSM8K_TRAIN)
    write_jsonl(tmp_path / "test.jsonl", GSM8K_TEST)
    return tmp_path


def test_jsonl_gsm8k_field_mapping_and_targets(gsm8k_files, tmp_path):
    factory, eval_problems = build(config(gsm8k_files, eval_size=2), None, cache_dir=str(tmp_path / "cache"))
    assert [(p.question, p.target) for p in eval_problems] == [("What is 6*7?", "42"), ("What is 1000+234?", "1234")]
    assert eval_problems[0].prompt == "User: What is 6*7?\nAssistant:"
    first_epoch = list(itertools.islice(factory(), 10))
    assert sorted(p.target for p in first_epoch) == sorted(str(n * 101) for n in range(1, 11))  # "1,010" → "1010"


def test_train_order_is_reshuffled_each_epoch_and_seeded(gsm8k_files, tmp_path):
    cache = str(tmp_path / "cache")
    factory, _ = build(config(gsm8k_files, eval_path=None), None, cache_dir=cache)
    stream = factory()
    epochs = [[p.target for p in itertools.islice(stream, 10)] for _ in range(3)]
    assert factory.epoch == 2
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)  # every epoch is a permutation of the split
    assert len({tuple(e) for e in epochs}) == 3  # ... a different one each time
    again, _ = build(config(gsm8k_files, eval_path=None), None, cache_dir=cache)
    assert [p.target for p in itertools.islice(again(), 30)] == sum(epochs, [])  # same seed, same order
    other, _ = build(config(gsm8k_files, eval_path=None, seed=1), None, cache_dir=cache)
    assert [p.target for p in itertools.islice(other(), 10)] != epochs[0]
    assert [p.target for p in itertools.islice(factory(start_epoch=2), 10)] == epochs[2]  # resumable


def test_parquet_math_boxed_targets_with_chat_template(tmp_path):
    pq.write_table(pa.Table.from_pylist(MATH_ROWS), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(MATH_ROWS[:1]), tmp_path / "test.parquet")
    cfg = config(tmp_path, train_path=str(tmp_path / "train.parquet"), eval_path=str(tmp_path / "test.parquet"),
                 question_key="problem",
                 answer_key="solution", target_format="boxed", system_prompt="boxed", use_chat_template=True)
    factory, eval_problems = build(cfg, make_tokenizer(), cache_dir=str(tmp_path / "cache"))
    assert sorted(p.target for p in itertools.islice(factory(), 2)) == ["-2", "\\frac{1}{2}"]
    (problem,) = eval_problems
    assert problem.question == MATH_ROWS[0]["problem"]
    assert problem.prompt.startswith("<|im_start|>system\n") and "\\boxed{}" in problem.prompt
    assert problem.prompt.endswith(f"user\n{MATH_ROWS[0]['problem']}<|im_end|>\n<|im_start|>assistant\n")


def test_streaming_jsonl(gsm8k_files):
    factory, eval_problems = build(config(gsm8k_files, streaming=True, eval_size=1, shuffle_buffer=4), None)
    assert [p.target for p in eval_problems] == ["42"]
    stream = factory()
    epochs = [sorted(p.target for p in itertools.islice(stream, 10)) for _ in range(2)]
    assert epochs[0] == epochs[1] == sorted(str(n * 101) for n in range(1, 11))


def test_a_row_missing_a_key_names_the_file_row_and_key(gsm8k_files, tmp_path):
    rows = [dict(r) for r in GSM8K_TRAIN]
    del rows[6]["question"]
    write_jsonl(gsm8k_files / "train.jsonl", rows)
    with pytest.raises(ValueError, match=r"train\.jsonl row 7: missing key 'question' \(dataset\.question_key\)"):
        build(config(gsm8k_files), None, cache_dir=str(tmp_path / "cache"))


def test_a_null_field_or_missing_column_in_parquet(tmp_path):
    rows = [dict(r) for r in MATH_ROWS] + [{**MATH_ROWS[0], "solution": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    cfg = config(tmp_path, train_path=str(tmp_path / "train.parquet"), eval_path=None,
                 question_key="problem", answer_key="solution", target_format="boxed")
    with pytest.raises(ValueError, match=r"train\.parquet row 3: key 'solution' is null \(dataset\.answer_key\)"):
        build(cfg, None, cache_dir=str(tmp_path / "cache"))
    cfg = dataclasses.replace(cfg, question_key="question")  # MATH calls it "problem"
    with pytest.raises(ValueError, match=r"row 1: missing key 'question' .* the row has: problem, level"):
        build(cfg, None, cache_dir=str(tmp_path / "cache"))


def test_an_answer_without_its_target_marker(gsm8k_files, tmp_path):
    write_jsonl(gsm8k_files / "test.jsonl", GSM8K_TEST + [{"question": "q", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"test\.jsonl row 4: 'answer' has no '#### <answer>' line"):
        build(config(gsm8k_files), None, cache_dir=str(tmp_path / "cache"))


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"dataset\.train_path: .*train\.jsonl does not exist"):
        build(config(tmp_path), None)


def test_prompts_over_max_prompt_tokens_are_skipped(gsm8k_files, tmp_path):
    rows = GSM8K_TRAIN[:3] + [{"question": "word " * 50, "answer": "#### 1"}]
    write_jsonl(gsm8k_files / "train.jsonl", rows)
    factory, _ = build(config(gsm8k_files, eval_path=None, max_prompt_tokens=20), make_tokenizer(),
                          cache_dir=str(tmp_path / "cache"))
    assert len({p.target for p in itertools.islice(factory(), 9)}) == 3
    assert factory.skipped == 3  # the long one, once per epoch
    tiny, _ = build(config(gsm8k_files, eval_path=None, max_prompt_tokens=1), make_tokenizer(),
                       cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="no prompt fits in dataset.max_prompt_tokens=1"):
        next(tiny())


def test_hub_source_names_its_splits():
    src = hf.HubProblems(path="openai/gsm8k", subset="main", split="train", eval_split="test")
    assert (src.location("train"), src.location("eval"), src.has_eval()) == ("openai/gsm8k[train]",
                                                                             "openai/gsm8k[test]", True)
    assert src._load_args("eval") == (("openai/gsm8k", "main"), {"split": "test"})


def test_an_unknown_file_type_names_the_key(tmp_path):
    (tmp_path / "train.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"^dataset\.train_path=.*train\.csv: unknown file type \.csv"):
        build(config(tmp_path, train_path=str(tmp_path / "train.csv")), None)


@pytest.mark.parametrize(
    ("answer", "fmt", "target"),
    [
        ("so 5 + 3 = <<5+3=8>>8\n#### 8", "gsm8k", "8"),
        ("#### 1,234,567", "gsm8k", "1234567"),
        ("#### -3.5", "gsm8k", "-3.5"),
        ("no marker", "gsm8k", None),
        ("thus $\\boxed{\\frac{\\sqrt{3}}{2}}$", "boxed", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "boxed", "2"),
        ("  42 ", "raw", "42"),
        (42, "raw", "42"),
    ],
)
def test_extract_target(answer, fmt, target):
    assert hf.extract_target(answer, fmt) == target


ARITHMETIC = [{"question": f"{n}+{n}=", "answer": str(2 * n)} for n in range(1, 11)]


@pytest.mark.parametrize("bad, message", [
    ({"question": "   ", "answer": "2"}, r"'question' is empty \(dataset\.question_key\); a question is text"),
    ({"question": 7, "answer": "2"}, r"'question' is a int \(dataset\.question_key\)"),
    ({"question": "1+1=", "answer": ["2", "two"]}, r"'answer' is a list \(dataset\.answer_key\); an answer is text or "
                                                   r"a number: \[\"2\", \"two\"\]"),
    ({"question": "1+1=", "answer": {"value": 2}}, r"'answer' is a dict \(dataset\.answer_key\)"),
    ({"question": "what is 1+1?", "answer": "2"}, r"the prompt has characters the model's tokenizer does not know"),
])
def test_every_row_is_checked_as_the_stream_reaches_it(tmp_path, bad, message):
    """Row 7 of 10 (not among the first rows the CLI reads): with bad_rows=fail the stream stops there naming the
    file and the row; with skip it is left out, counted and logged."""
    from forge_exp.models.tokenizer import build_char_tokenizer

    write_jsonl(tmp_path / "train.jsonl", ARITHMETIC[:6] + [bad] + ARITHMETIC[6:])
    fields = dict(eval_path=None, target_format="raw", template="{question}", streaming=True, shuffle_buffer=1)
    factory, _ = build(config(tmp_path, **fields), build_char_tokenizer())
    stream = factory()
    assert len(list(itertools.islice(stream, 6))) == 6  # rows 1-6: fine
    with pytest.raises(ValueError, match=rf"train\.jsonl( \(streamed, epoch 0\))? row 7: {message}"):
        next(stream)
    factory, _ = build(config(tmp_path, **fields, bad_rows="skip"), build_char_tokenizer())
    targets = [p.target for p in itertools.islice(factory(), 20)]  # two epochs of the 10 good rows
    assert sorted(targets) == sorted(r["answer"] for r in ARITHMETIC * 2)
    assert factory.bad_rows == 2  # a streamed row is known by its place in an epoch: once per epoch


def test_a_loaded_split_checks_fields_when_loaded_and_skips_bad_eval_rows(tmp_path, caplog):
    from forge_exp.models.tokenizer import build_char_tokenizer

    write_jsonl(tmp_path / "train.jsonl", ARITHMETIC)
    write_jsonl(tmp_path / "test.jsonl", [ARITHMETIC[0], {"question": "", "answer": "1"}, ARITHMETIC[1]])
    fields = dict(target_format="raw", template="{question}")
    with pytest.raises(ValueError, match=r"test\.jsonl row 2: 'question' is empty"):
        build(config(tmp_path, **fields), build_char_tokenizer())
    factory, heldout = build(config(tmp_path, **fields, bad_rows="skip"), build_char_tokenizer())
    assert [p.target for p in heldout] == ["2", "4"]
    assert "test.jsonl row 2: 'question' is empty" in caplog.text and "skipped (dataset.bad_rows=skip)" in caplog.text
    write_jsonl(tmp_path / "train.jsonl", ARITHMETIC + [{"question": "what is 1+1?", "answer": "2"}])
    factory, _ = build(config(tmp_path, **fields, bad_rows="skip"), build_char_tokenizer())
    assert len(list(itertools.islice(factory(), 30))) == 30 and factory.bad_rows == 1  # 3 epochs: one row, once
    assert caplog.text.count("train.jsonl row 11: the prompt has characters") == 1


@pytest.mark.parametrize("streaming", [False, True])
def test_a_json_array_after_white_space_loads(tmp_path, streaming):
    """Valid JSON that datasets' own reader refuses ("Expected object or value"): read here instead."""
    (tmp_path / "train.json").write_text("\n  " + json.dumps(ARITHMETIC))
    cfg = config(tmp_path, train_path=str(tmp_path / "train.json"), eval_path=None, target_format="raw",
                 streaming=streaming, shuffle_buffer=2)
    factory, _ = build(cfg, None)
    assert sorted(p.target for p in itertools.islice(factory(), 10)) == sorted(r["answer"] for r in ARITHMETIC)
