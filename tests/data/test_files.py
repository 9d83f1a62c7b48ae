"""Local row files read for the CLI's checks: every error names the file (and the row when there is one), and
nothing that is not a regular file is opened."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forge_exp.data.files import data_files, first_rows, jsonl_rows

ROW = {"question": "1+1=", "answer": "2"}


def test_rows_of_jsonl_json_arrays_and_parquet(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(ROW) + "\n\n" + json.dumps(ROW) + "\n")
    (tmp_path / "b.json").write_text("\n  " + json.dumps([ROW, ROW, ROW]))  # an array after white space
    pq.write_table(pa.Table.from_pylist([ROW, ROW]), tmp_path / "c.parquet")
    assert first_rows(str(tmp_path / "a.jsonl"), "json", 5) == [(1, ROW), (2, ROW)]
    assert first_rows(str(tmp_path / "b.json"), "json", 2) == [(1, ROW), (2, ROW)]
    assert first_rows(str(tmp_path / "c.parquet"), "parquet", 5) == [(1, ROW), (2, ROW)]


@pytest.mark.parametrize("name, content, message", [
    ("bytes.jsonl", b'{"question": "1+1=", "answer": "2"}\n{"question": "\xff\xfe"}\n',
     r"bytes\.jsonl row 2: not UTF-8 text \(byte 0xff at position 14 of the row\)"),
    ("cut.json", b'[{"question": "1+1=", "answer": "2"},', r"cut\.json: not a valid JSON array \(Expecting value at "
                                                            r"line 1 column 38; cut short\?\)"),
    ("ints.json", b"[1, 2, 3]", r"ints\.json row 1: expected a JSON object with the row's fields, got int 1"),
    ("object.json", b'{"rows": [1]}', None),  # not an array: read as JSON lines (one row, checked by its fields)
    ("bad.parquet", b"not a parquet file", r"bad\.parquet: not a readable parquet file \(.*magic bytes"),
    ("lines.jsonl", b'{"question": "1+1=", "answer": "2"}\n[1]\n', r"lines\.jsonl row 2: expected a JSON object"),
])
def test_a_file_that_does_not_read_is_named(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    builder = "parquet" if name.endswith(".parquet") else "json"
    if message is None:
        assert first_rows(str(tmp_path / name), builder, 5) == [(1, {"rows": [1]})]
        return
    with pytest.raises(ValueError, match=message):
        first_rows(str(tmp_path / name), builder, 5)


def test_only_regular_files_are_data(tmp_path):
    with pytest.raises(ValueError, match=r"^dataset\.train_path: \S+nope\.jsonl does not exist"):
        data_files(str(tmp_path / "nope.jsonl"), "train_path")
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(ValueError, match=r"^dataset\.train_path: \S+d\.jsonl is a directory; give a file, or a glob of "
                                         r"its files such as \S+d\.jsonl/\*\.jsonl$"):
        data_files(str(tmp_path / "d.jsonl"), "train_path")
    os.mkfifo(tmp_path / "pipe.jsonl")  # reading it would wait for a writer forever
    with pytest.raises(ValueError, match=r"^dataset\.eval_path: \S+pipe\.jsonl is a named pipe"):
        data_files(str(tmp_path / "p*.jsonl"), "eval_path")
    (tmp_path / "ok.jsonl").write_text(json.dumps(ROW))
    assert data_files(str(tmp_path / "ok.jsonl"), "train_path") == [str(tmp_path / "ok.jsonl")]
    assert list(jsonl_rows(str(tmp_path / "ok.jsonl"))) == [(1, ROW)]
