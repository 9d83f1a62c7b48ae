"""What is checked before any process starts, beyond the schema: the data files' first rows, the prompt against the
model's tokenizer, the components' imports and arguments. Each is one line naming the file, row or key."""

from __future__ import annotations

import importlib.util
import json

import pytest

from forge_exp.apps.preflight import check
from forge_exp.config.validate import validate
from tests.config.helpers import compose_cfg


def files(tmp_path, rows, eval_rows=None) -> list[str]:
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (eval_rows or rows)))
    return ["dataset=jsonl", f"dataset.train_path={tmp_path / 'train.jsonl'}",
            f"dataset.eval_path={tmp_path / 'test.jsonl'}"]


def preflight(*overrides: str) -> None:
    check(validate(compose_cfg(*overrides)))


def test_the_tiny_model_runs_your_own_digit_problems(tmp_path):
    preflight(*files(tmp_path, [{"question": "37-12=", "answer": "25"}, {"question": "9-4=", "answer": "5"}]))


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"question": "37-12="}], r"train\.jsonl row 1: missing key 'answer' \(dataset\.answer_key\)"),
        ([{"question": "1+1=", "answer": "2"}, {"question": None, "answer": "3"}],
         r"train\.jsonl row 2: key 'question' is null \(dataset\.question_key\)"),
        ([{"question": "what is six?", "answer": "6"}], r"train\.jsonl row 1: the prompt has characters the model's "
                                                        r"tokenizer does not know"),
    ],
)
def test_bad_rows_are_one_line_naming_file_and_row(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        preflight(*files(tmp_path, rows))


def test_missing_file_empty_file_and_bad_json(tmp_path):
    with pytest.raises(ValueError, match=r"^dataset\.train_path: .*nope\.jsonl does not exist"):
        preflight("dataset=jsonl", f"dataset.train_path={tmp_path / 'nope.jsonl'}", "dataset.eval_path=null")
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"^dataset\.train_path: .*train\.jsonl has no rows"):
        preflight("dataset=jsonl", f"dataset.train_path={tmp_path / 'train.jsonl'}", "dataset.eval_path=null")
    (tmp_path / "train.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n{"question": \n')
    with pytest.raises(ValueError, match=r"train\.jsonl row 2: not valid JSON"):
        preflight("dataset=jsonl", f"dataset.train_path={tmp_path / 'train.jsonl'}", "dataset.eval_path=null")


def test_a_chat_template_asked_for_but_missing(tmp_path):
    with pytest.raises(ValueError, match=r"row 1: dataset\.use_chat_template=true but the tokenizer .* has no chat "
                                         r"template"):
        preflight(*files(tmp_path, [{"question": "1+1=", "answer": "2"}]), "dataset.use_chat_template=true")


def test_components_are_imported_and_their_arguments_checked():
    with pytest.raises(ValueError, match=r"^algorithm\.loss\._target_: cannot import 'nope\.Loss'"):
        preflight("algorithm.loss._target_=nope.Loss")
    with pytest.raises(ValueError, match=r"^reward\.functions\.exact\.scale: .*ExactAnswerReward takes no argument"):
        preflight("+reward.functions.exact.scale=2")
    with pytest.raises(ValueError, match=r"^trainer\._target_: cannot import 'my\.Trainer'"):
        preflight("trainer._target_=my.Trainer")


def test_the_tool_experiment_passes_and_a_model_that_cannot_write_the_tool_format_is_refused():
    preflight("experiment=tool_arithmetic")
    with pytest.raises(ValueError, match=r"^env\.chat_format=tiny writes tool calls and results with '\[\]\(\)\?', "
                                         r"which model\.alphabet lacks"):
        preflight("env=calculator", "env.chat_format=tiny")
    # an episode, not dataset.max_new_tokens, is what must fit: 64 + 20 positions of the model's 96, then 80 + 20
    preflight("experiment=tool_arithmetic", "dataset.max_new_tokens=200")
    with pytest.raises(ValueError, match=r"^model\.max_position_embeddings=96 is shorter than an episode's longest "
                                         r"sequence, env\.max_total_tokens=80 plus a turn's env\.turn_tokens=20"):
        preflight("experiment=tool_arithmetic", "env.max_total_tokens=80")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_an_engine_whose_extra_is_not_installed_is_refused_before_its_process_starts():
    with pytest.raises(ValueError, match=r"^generator=vllm needs vLLM: .* \(no module named 'vllm' for \S+\)$"):
        preflight("generator=vllm")


def test_a_checkpoint_dir_that_cannot_be_written(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ValueError, match=r"^checkpoint\.dir=\S+a_file is a file, not a directory"):
        preflight("checkpoint.every=2", f"checkpoint.dir={a_file}")
    with pytest.raises(ValueError, match=r"^checkpoint\.dir=\S+a_file/ckpt: cannot write there \(Not a directory"):
        preflight("checkpoint.every=2", f"checkpoint.dir={a_file}/ckpt")
    preflight("checkpoint.every=2", f"checkpoint.dir={tmp_path}/new/ckpt")  # made
    assert (tmp_path / "new" / "ckpt").is_dir()


def test_with_bad_rows_skipped_a_bad_first_row_is_left_to_the_stream_but_a_wrong_mapping_is_not(tmp_path):
    good, bad = {"question": "1+1=", "answer": "2"}, {"question": "1+1=", "answer": ["2"]}
    overrides = files(tmp_path, [good, bad, good])
    with pytest.raises(ValueError, match=r"train\.jsonl row 2: 'answer' is a list"):
        preflight(*overrides)
    preflight(*overrides, "dataset.bad_rows=skip")
    wrong_key = files(tmp_path, [good, good])
    with pytest.raises(ValueError, match=r"row 1: missing key 'solution' .*\(and every other of the first 2 rows: "
                                         r"dataset\.bad_rows=skip skips a few bad rows, not a wrong field mapping\)"):
        preflight(*wrong_key, "dataset.bad_rows=skip", "dataset.answer_key=solution")


def test_the_log_says_why_a_sleep_mode_engine_is_never_put_to_sleep():
    from forge_exp.apps.preflight import resolve_model

    def note(*overrides):
        notes = resolve_model(validate(compose_cfg("generator=vllm", "generator.enable_sleep_mode=true", *overrides)))
        (said,) = [n for n in notes if n.startswith("generator.enable_sleep_mode=true: the GRPO loop does not put")]
        return said

    assert "rollouts overlap training" in note()
    for turns in ("algorithm.max_policy_age=0", "algorithm.rollout_waves=true"):
        assert "rollouts and training take turns" in note(turns), turns
    assert not any("sleep" in n for n in resolve_model(validate(compose_cfg("generator=vllm"))))
