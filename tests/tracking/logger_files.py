"""Reading back what the loggers beside MLflow wrote, each through its own format: TensorBoard's event files with
TensorBoard's EventAccumulator, a wandb offline run from its transaction log (`run-<id>.wandb`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024  # the .wandb file is a LevelDB-style log: 32 KiB blocks of records with a 7-byte header each
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_texts(log_dir: Path) -> dict[str, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag.removesuffix("/text_summary"): acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode()
            for tag in acc.Tags()["tensors"]}


def wandb_records(run_file: Path) -> list:
    """Every record of a wandb transaction log, as wandb's own protobuf messages."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", run_file
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        if kind == 0 and length == 0:
            break
        pending += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(wandb_dir: Path) -> dict:
    """The one offline run under <dir>/wandb: its id, history rows ({key: value}), config and exit code."""
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    out = {"id": run_file.stem.removeprefix("run-"), "history": [], "config": {}, "exit_code": None,
           "files": run_file.parent / "files"}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out


def by_step(rows: list[dict], step_key: str = "step") -> dict[str, list[tuple[int, float]]]:
    """wandb history rows as {metric: [(step, value)]}, the run's step taken from its own column."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if not key.startswith("_") and key != step_key:
                out.setdefault(key, []).append((row[step_key], value))
    return out
