"""Inputs checked before any process starts: each bad config, data file, template, loss or store below is one line
on stderr naming the key or the file and row, exit code 2, no service process spawned and no MLflow store touched.
What can only show once the run is going (a bad row past the first ones, a reward that raises on every call) ends
the run FAILED with that error; dataset.eval_size=0 ("no held-out set") runs to the end."""

from __future__ import annotations

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.faults.helpers import Run, cli, last_line, steps, the_run

GOOD = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(1, 9)]


def write(path, rows=None, text=None):
    path.write_text(text if text is not None else "".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jsonl(tmp_path, rows=None, text=None, eval_rows=None) -> list[str]:
    train = write(tmp_path / "train.jsonl", rows, text)
    out = ["dataset=jsonl", f"dataset.train_path={train}", "dataset.system_prompt=none"]
    if eval_rows is not None:
        out.append(f"dataset.eval_path={write(tmp_path / 'test.jsonl', eval_rows)}")
    else:
        out.append("dataset.eval_path=null")
    return out


def parquet(tmp_path, table) -> list[str]:
    pq.write_table(table, tmp_path / "train.parquet")
    return ["dataset=parquet", f"dataset.train_path={tmp_path / 'train.parquet'}", "dataset.eval_path=null",
            "dataset.system_prompt=none"]


STRINGS = pa.schema([("question", pa.string()), ("answer", pa.string())])
CASES = {  # name: (overrides, made from tmp_path; what the one line must say)
    "missing file": (lambda t: ["dataset=jsonl", f"dataset.train_path={t}/nope.jsonl", "dataset.eval_path=null"],
                     r"dataset\.train_path: \S*nope\.jsonl does not exist"),
    "malformed row": (lambda t: jsonl(t, text='{"question": "1+1=", "answer": "2"}\n{"question": \n'),
                      r"train\.jsonl row 2: not valid JSON"),
    "missing field": (lambda t: jsonl(t, [{"question": "1+1="}]),
                      r"train\.jsonl row 1: missing key 'answer' \(dataset\.answer_key\)"),
    "null answer": (lambda t: jsonl(t, [{"question": "1+1=", "answer": None}]),
                    r"train\.jsonl row 1: key 'answer' is null \(dataset\.answer_key\)"),
    "empty file": (lambda t: jsonl(t, text="\n"), r"dataset\.train_path: \S*train\.jsonl has no rows"),
    "empty eval file": (lambda t: jsonl(t, GOOD, eval_rows=[]), r"dataset\.eval_path: \S*test\.jsonl has no rows"),
    "empty parquet": (lambda t: parquet(t, pa.table({"question": [], "answer": []}, schema=STRINGS)),
                      r"dataset\.train_path: \S*train\.parquet has no rows"),
    "parquet null answer": (lambda t: parquet(t, pa.table({"question": ["1+1="], "answer": [None]}, schema=STRINGS)),
                            r"train\.parquet row 1: key 'answer' is null"),
    "unknown file type": (lambda t: ["dataset=jsonl", f"dataset.train_path={write(t / 'train.csv', text='q,a')}"],
                          r"dataset\.train_path=\S*train\.csv: unknown file type \.csv"),
    "chat template": (lambda t: [*jsonl(t, GOOD), "dataset.use_chat_template=true"],
                      r"row 1: dataset\.use_chat_template=true but the tokenizer .* has no chat template"),
    "characters": (lambda t: jsonl(t, [{"question": "what is six?", "answer": "6"}]),
                   r"row 1: the prompt has characters the model's tokenizer does not know"),
    "loss returns a vector": (lambda t: ["algorithm.loss._target_=tests.faults.bad.VectorLoss"],
                              r"algorithm\.loss \(tests\.faults\.bad\.VectorLoss\) returned \[2, 3\]; a loss returns "
                              r"a scalar"),
    "loss returns NaN": (lambda t: ["algorithm.loss._target_=tests.faults.bad.NanLoss"],
                         r"algorithm\.loss \(tests\.faults\.bad\.NanLoss\) returned nan"),
    "loss without gradient": (lambda t: ["algorithm.loss._target_=tests.faults.bad.ConstantLoss"],
                              r"algorithm\.loss \(tests\.faults\.bad\.ConstantLoss\) returned a value with no "
                              r"gradient"),
    "loss raises": (lambda t: ["algorithm.loss._target_=tests.faults.bad.RaisingLoss"],
                    r"algorithm\.loss \(tests\.faults\.bad\.RaisingLoss\) raised on a test batch of 2 x 3 tokens: "
                    r"RuntimeError"),
    "context too short": (lambda t: ["model.max_position_embeddings=4"],
                          r"model\.max_position_embeddings=4 is shorter than a prompt"),
    "eval temperature": (lambda t: ["eval.temperature=-1"], r"eval\.temperature must be in \(0, inf\]"),
    "pass@1": (lambda t: ["eval.pass_k=1"], r"eval\.pass_k must be 0 \(off\) or >= 2"),
    "+foo": (lambda t: ["+foo=1"], r"foo is not a config key"),
    "+algorithm.foo": (lambda t: ["+algorithm.foo=1"], r"algorithm\.foo is not a config key"),
    "reward failure rate": (lambda t: ["reward.max_failure_rate=2"], r"reward\.max_failure_rate must be in \[0, 1\]"),
    "reward failure steps": (lambda t: ["reward.failure_steps=0"], r"reward\.failure_steps must be >= 1"),
    "stop grace": (lambda t: ["checkpoint.stop_grace_s=-1"], r"checkpoint\.stop_grace_s must be >= 0"),
    "reward import": (lambda t: ["reward.functions.exact._target_=nope.Reward"],
                      r"reward\.functions\.exact\._target_: cannot import 'nope\.Reward'"),
    "resume without checkpoint": (lambda t: ["resume=true"], r"resume=true: no checkpoint in \S+ \(checkpoint\.dir\)"),
    "tracking server down": (lambda t: [f"tracking.uri=http://127.0.0.1:{closed_port()}"],
                             r"tracking\.uri=http://127\.0\.0\.1:\d+: no MLflow server answered within 5 s"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line_before_anything_starts(tmp_path, warmstart_cache, name):
    make, message = CASES[name]
    cmd = [a for a in cli(tmp_path, warmstart_cache, *make(tmp_path)) if not (
        a.startswith("tracking.uri=") and name == "tracking server down" and "sqlite" in a)]
    run = Run(cmd, cwd=tmp_path)
    rc, _, err = run.finish(120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("forge-exp: error: ")
    import re

    assert re.search(message, lines[0]), lines[0]
    assert not [p for p in run.seen], "a process was spawned"
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def test_a_bad_row_past_the_first_ones_fails_the_dataset_service_naming_file_and_row(tmp_path, warmstart_cache):
    rows = [*GOOD, {"question": "1+1="}]  # row 9: preflight reads the first 5
    run = Run(cli(tmp_path, warmstart_cache, *jsonl(tmp_path, rows, eval_rows=GOOD), "steps=4"))
    rc, _, err = run.finish(300)
    assert rc == 1, err[-3000:]
    # services=cpu: the dataset service lives in the controller's process, one of it (no replica to name)
    assert last_line(err).startswith("forge-exp: error: dataset failed: ValueError: ")
    assert "train.jsonl row 9: missing key 'answer' (dataset.answer_key)" in last_line(err)
    assert run.orphans() == []
    _, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FAILED"


def test_a_reward_that_raises_on_every_call_fails_the_run_with_its_error(tmp_path, warmstart_cache):
    run = Run(cli(tmp_path, warmstart_cache, "steps=30", "reward.functions.exact._target_=tests.faults.bad."
                                                        "broken_reward", "reward.failure_steps=3"))
    rc, _, err = run.finish(300)
    assert rc == 1, err[-3000:]
    assert last_line(err) == ("forge-exp: error: reward.functions.exact failed on 100% of the completions for 3 steps "
                              "in a row (reward.max_failure_rate=0.5): TypeError: unsupported operand type(s) for "
                              "+: 'int' and 'str'")
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FAILED" and steps(client, r.info.run_id) == [1, 2, 3]


def test_no_held_out_set_runs_to_the_end(tmp_path, warmstart_cache):
    rc, out, err = Run(cli(tmp_path, warmstart_cache, "steps=3", "dataset.eval_size=0")).finish(300)
    assert rc == 0, err[-3000:]
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FINISHED" and steps(client, r.info.run_id) == [1, 2, 3]
    assert "eval/accuracy" not in r.data.metrics and "held-out accuracy" not in out
