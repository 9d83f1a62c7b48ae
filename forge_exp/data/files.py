"""Local row files, read the way the CLI's checks and error messages need: every error names the file, and the row
when there is one. The dataset service reads the files through `datasets`; what is read here is the first rows
(apps/preflight.py) and the rows of a file `datasets` could not read (to say which one).

    data_files(pattern, key)       the files a train_path / eval_path matches: each a regular file (not a directory,
                                   not a pipe that would be read forever)
    file_rows(file, builder)       (row number, row) of its rows: jsonl, a .json array, or parquet
    first_rows(file, builder, n)   the first n of them
    jsonl_rows(file)               (row number, row) of every row of a jsonl file, row N being its Nth non-empty line
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def data_files(pattern: str, key: str) -> list[str]:
    """The files `pattern` (a path or a glob) matches, sorted; a ValueError naming `dataset.<key>` when there is
    none or one is not a regular file."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise ValueError(f"dataset.{key}: {pattern} does not exist (cwd {Path.cwd()})")
    for file in files:
        mode = os.stat(file).st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"dataset.{key}: {file} is a directory; give a file, or a glob of its files such as "
                             f"{os.path.join(file, '*' + Path(file).suffix)}")
        if not stat.S_ISREG(mode):
            kind = "a named pipe" if stat.S_ISFIFO(mode) else "not a regular file"
            raise ValueError(f"dataset.{key}: {file} is {kind}, which would be read until it ends (maybe never); "
                             f"give a file")
    return files


def file_rows(file: str, builder: str) -> Iterator[tuple[int, dict]]:
    """(row number, row) of every row of `file`, read as `builder` ("json" or "parquet") reads it."""
    if builder == "parquet":
        return _parquet_rows(file)
    if file.endswith(".json") and _first_character(file) == "[":
        return iter(_json_array_rows(file))
    return jsonl_rows(file)


def first_rows(file: str, builder: str, n: int) -> list[tuple[int, dict]]:
    return list(itertools.islice(file_rows(file, builder), n))


def array_after_white_space(file: str) -> bool:
    """A .json file holding an array that white space precedes: valid JSON, which `datasets` (4.x) reads only when
    '[' is its first byte."""
    with open(file, "rb") as f:
        starts_blank = f.read(1).isspace()
    return file.endswith(".json") and starts_blank and _first_character(file) == "["


def jsonl_rows(file: str) -> Iterator[tuple[int, dict]]:
    """(row number, row) of a jsonl file, row N being its Nth non-empty line; a line that is not UTF-8 text or not
    a JSON object is a ValueError naming the file and the row."""
    with open(file, "rb") as f:
        for row_number, raw in enumerate((line for line in f if line.strip()), start=1):
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise ValueError(f"{file} row {row_number}: not UTF-8 text (byte {raw[err.start]:#04x} at position "
                                 f"{err.start} of the row); save the file as UTF-8") from None
            except json.JSONDecodeError as err:
                raise ValueError(f"{file} row {row_number}: not valid JSON ({err})") from None
            yield row_number, _an_object(row, file, row_number)


def _json_array_rows(file: str) -> list[tuple[int, dict]]:
    """The rows of a file holding one JSON array of row objects."""
    try:
        rows = json.loads(Path(file).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{file}: not UTF-8 text (byte at offset {err.start}); save the file as UTF-8") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: not a valid JSON array ({err.msg} at line {err.lineno} column {err.colno}; cut "
                         f"short?)") from None
    if not isinstance(rows, list):
        raise ValueError(f"{file}: expected a JSON array of rows, got a {type(rows).__name__}")
    return [(i, _an_object(row, file, i)) for i, row in enumerate(rows, start=1)]


def _parquet_rows(file: str) -> Iterator[tuple[int, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not Path(file).stat().st_size:
        return
    row_number = 0
    try:
        table = pq.ParquetFile(file)
        for group in range(table.num_row_groups):  # one row group at a time: the first rows read only the first
            for row in table.read_row_group(group).to_pylist():
                row_number += 1
                yield row_number, row
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{file}: not a readable parquet file ({str(err).splitlines()[0]})") from None


def _first_character(file: str) -> str:
    """The file's first character that is not white space ('' for an empty file)."""
    with open(file, "rb") as f:
        while chunk := f.read(4096):
            if stripped := chunk.lstrip():
                return chr(stripped[0])
    return ""


def _an_object(row, file: str, row_number: int) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{file} row {row_number}: expected a JSON object with the row's fields, got "
                         f"{type(row).__name__} {json.dumps(row)[:60]}")
    return row
