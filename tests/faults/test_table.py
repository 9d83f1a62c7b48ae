"""Faults as a user meets them, one row each: a real `forge-exp` on a real MLflow store (or server), and what it
must end in. A row names the last line on stderr (in full), the exit code and the MLflow status of the run; a
mistake that can be seen before anything starts (status None) is that one line alone, with no process spawned and
no run in the store; a run that started logs each of its steps once and leaves no process behind.

The rows are numbered by the kind of fault (docs/reliability.md maps each promise to its row): 1 MLflow refusing the
run, 4 data files, 5 data rows, 6 the checks themselves, 7 a non-finite loss, 8 a reward out of range, 9 what is
checkable before the start, 10 the config's own lines. The faults that need a run to be under way first (a second
start in a run dir, a damaged checkpoint, a stop, a full disk, a SLURM job that never starts) are in
test_run_dir.py, test_full_disks.py and test_slurm_fit.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import sqlite3
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.faults.helpers import Mounts, Run, cli, last_line, steps, the_run, trained
from tests.tracking.test_answers import NotMlflow

E = "forge-exp: error: "
GOOD = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(1, 11)]
NO_WARM_START = ["model.warmstart.steps=0"]  # (a fresh tiny model on its own data: the warm start is not the point)


@dataclass
class Where:
    t: Path  # the test's directory
    stack: ExitStack  # what a row starts (a server) is stopped on it
    cache: Path  # the session's warm-start cache, trained


@dataclass
class Case:
    args: Callable[[Where], list[str]]  # the row's overrides (it may write or start what they need)
    last: str | None  # the last line on stderr, a regex matched in full (None: a run that finished)
    code: int = 2
    status: str | None = None  # None: refused before anything started
    steps: tuple[int, ...] = ()  # what MLflow holds under loss/total, each once
    mounts: Callable[[Path], list[str]] | None = None  # mount commands for a private namespace (a read-only dir)
    check: Callable[..., None] | None = None  # more to assert: check(client, run, out, err, tmp_path)


def files(t: Path, rows=None, *, text: str | bytes | None = None, name="train.jsonl", more=()) -> list[str]:
    """dataset=jsonl (or parquet) on one train file (rows, or its raw text), no eval split."""
    content = text if text is not None else "".join(json.dumps(r) + "\n" for r in rows)
    (t / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    kind = "parquet" if name.endswith(".parquet") else "jsonl"
    return [f"dataset={kind}", f"dataset.train_path={t / name}", "dataset.eval_path=null", *more]


def fifo(t: Path) -> list[str]:
    os.mkfifo(t / "pipe.jsonl")  # a reader would wait for a writer forever
    return ["dataset=jsonl", f"dataset.train_path={t / 'pipe.jsonl'}", "dataset.eval_path=null"]


def deleted_experiment(t: Path) -> list[str]:
    client = MlflowClient(f"sqlite:///{t}/mlflow.db")
    client.delete_experiment(client.create_experiment("forge-exp"))
    return []


def checkpoint_of_another_store(t: Path) -> list[str]:
    step = t / "run" / "checkpoints" / "step_0000002"
    step.mkdir(parents=True)
    (step / "state.json").write_text(json.dumps({"step": 2, "run_id": "0" * 32, "pending_metrics": [],
                                                 "tracking_uri": "sqlite:////elsewhere/mlflow.db"}))
    return ["resume=true", "checkpoint.every=2"]


def not_mlflow(stack: ExitStack) -> list[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack.callback(server.server_close)
    stack.callback(server.shutdown)
    return [f"tracking.uri=http://127.0.0.1:{server.server_address[1]}"]


def a_file(t: Path) -> Path:
    (t / "a_file").write_text("")
    return t / "a_file"


def a_model(w: Where, damage: str) -> list[str]:
    """model.path: a copy of the cached warm start (a valid HF directory), then damaged."""
    model = w.t / "model"
    shutil.copytree(trained(w.cache), model)
    if damage == "weights":
        with open(model / "model.safetensors", "r+b") as f:
            f.truncate((model / "model.safetensors").stat().st_size - 1000)
    else:
        (model / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 12')
    return [f"model.path={model}"]


def no_vllm() -> list[str]:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    return ["generator=vllm"]


def read_only(t: Path) -> list[str]:
    (t / "ro").mkdir(exist_ok=True)
    return [f"mount --bind {t}/ro {t}/ro", f"mount -o remount,bind,ro {t}/ro"]


def bad_rows_logged(client, run, out, err, t) -> None:
    assert run.data.metrics["data/bad_rows"] == 2.0
    said = out + err
    assert "train.json row 7: the prompt has characters the model's tokenizer does not know" in said
    assert "train.json row 8: 'answer' is a dict (dataset.answer_key)" in said
    assert said.count("the row is skipped (dataset.bad_rows=skip)") == 2  # each once, however many epochs


def report_printed(client, run, out, err, t) -> None:
    """--verbose: the service's traceback on stderr too, before the line; and in failure.txt either way."""
    assert "Traceback" in err and "FloatingPointError" in err
    assert "FloatingPointError" in (t / "run" / "failure.txt").read_text()


SKIPPED = [*GOOD[:6], {"question": "what is 7+7?", "answer": "14"}, {"question": "8+8=", "answer": {"v": 16}},
           *GOOD[6:]]  # rows 7 and 8 are bad: past the 5 rows the CLI reads first

CASES: dict[str, Case] = {
    # 1. MLflow refusing the run: asked before anything starts
    "1 an empty tracking.experiment": Case(
        lambda w: ["tracking.experiment="],
        rf"{E}tracking\.experiment must be a name \(MLflow refuses an empty one\), got ''"),
    "1 the experiment deleted in the store": Case(
        lambda w: deleted_experiment(w.t),
        rf"{E}tracking\.experiment=forge-exp: the experiment is deleted in sqlite:///\S+; restore it "
        rf"\(MLFLOW_TRACKING_URI=\S+ mlflow experiments restore --experiment-id 1\) or give another "
        rf"tracking\.experiment"),
    "1 resume=true against a store without the run": Case(
        lambda w: checkpoint_of_another_store(w.t),
        rf"{E}resume=true: the checkpoint's MLflow run 0{{32}} is not in tracking\.uri=sqlite:///\S+; resume with "
        rf"tracking\.uri=sqlite:////elsewhere/mlflow\.db"),
    "1 a server that answers /health but is not MLflow": Case(
        lambda w: not_mlflow(w.stack),
        rf"{E}tracking\.uri=http://127\.0\.0\.1:\d+: the server answers /health but is not an MLflow tracking "
        rf"server \(GET /api/2\.0/mlflow/experiments/get-by-name: HTTP 404, text/html\); check the host and port"),
    # 4. data files: each named, before anything starts
    "4 non-UTF-8 bytes": Case(
        lambda w: files(w.t, text=b'{"question": "1+1=", "answer": "2"}\n{"question": "\xff"}\n'),
        rf"{E}\S+train\.jsonl row 2: not UTF-8 text \(byte 0xff at position 14 of the row\); save the file as UTF-8"),
    "4 a .json array cut short": Case(
        lambda w: files(w.t, text='[{"question": "1+1=", "answer": "2"},', name="train.json"),
        rf"{E}\S+train\.json: not a valid JSON array \(Expecting value at line 1 column 38; cut short\?\)"),
    "4 a .json array of numbers": Case(
        lambda w: files(w.t, text="[1, 2, 3]", name="train.json"),
        rf"{E}\S+train\.json row 1: expected a JSON object with the row's fields, got int 1"),
    "4 a corrupt parquet": Case(
        lambda w: files(w.t, text="not a parquet file", name="train.parquet"),
        rf"{E}\S+train\.parquet: not a readable parquet file \(Parquet magic bytes not found.*\)"),
    "4 a directory as train_path": Case(
        lambda w: (w.t / "train.jsonl").mkdir() or ["dataset=jsonl", f"dataset.train_path={w.t}/train.jsonl"],
        rf"{E}dataset\.train_path: \S+train\.jsonl is a directory; give a file, or a glob of its files such as "
        rf"\S+train\.jsonl/\*\.jsonl"),
    "4 a named pipe as train_path": Case(
        lambda w: fifo(w.t),
        rf"{E}dataset\.train_path: \S+pipe\.jsonl is a named pipe, which would be read until it ends \(maybe "
        rf"never\); give a file"),
    # 5. data rows: the first rows before anything starts, every later one as the stream reaches it
    "5 an empty question in the first rows": Case(
        lambda w: files(w.t, [GOOD[0], {"question": " ", "answer": "2"}]),
        rf"{E}\S+train\.jsonl row 2: 'question' is empty \(dataset\.question_key\); a question is text: \" \""),
    "5 a list answer in the first rows": Case(
        lambda w: files(w.t, [{"question": "1+1=", "answer": ["2", "two"]}]),
        rf"{E}\S+train\.jsonl row 1: 'answer' is a list \(dataset\.answer_key\); an answer is text or a number: "
        rf"\[\"2\", \"two\"\]"),
    "5 row 7 with characters the tokenizer lacks": Case(
        lambda w: files(w.t, SKIPPED[:7] + GOOD[6:], more=(*NO_WARM_START, "steps=4")),
        rf"{E}dataset failed in sample: ValueError: \S+train\.jsonl row 7: the prompt has characters the model's "
        rf"tokenizer "
        rf"does not know \('what is 7\+7\?'\); .*", code=1, status="FAILED"),
    "5 bad rows skipped with dataset.bad_rows=skip (4: a .json array after a newline)": Case(
        lambda w: files(w.t, text="\n" + json.dumps(SKIPPED), name="train.json",
                        more=(*NO_WARM_START, "steps=2", "dataset.bad_rows=skip")),
        None, code=0, status="FINISHED", steps=(1, 2), check=bad_rows_logged),
    # 6. the checks themselves: one line, never their own traceback
    "6 a reward class whose __init__ raises": Case(
        lambda w: ["reward.functions.exact._target_=tests.faults.bad.NeedsAJudge"],
        rf"{E}reward\.functions\.exact \(tests\.faults\.bad\.NeedsAJudge\) raised RuntimeError: no judge model on "
        rf"this machine"),
    "6 builtins.len as a reward function": Case(
        lambda w: ["reward.functions.exact._target_=builtins.len"],
        rf"{E}reward\.functions\.exact\._target_: builtins\.len is not a reward function: it must be callable as "
        rf"fn\(prompt, response, target\[, problem=\.\.\.\]\) -> float"),
    "6 a read-only hydra.run.dir": Case(
        lambda w: [f"hydra.run.dir={w.t}/ro"],
        rf"{E}hydra\.run\.dir=\S+/ro: cannot write there \(Read-only file system\); give a directory this user can "
        rf"write", mounts=read_only),
    # 7. a loss of +inf with a finite gradient; the run stops naming the loss (--verbose: the report shown too)
    "7 a loss of +inf, with --verbose": Case(
        lambda w: ["algorithm.loss._target_=tests.faults.bad.InfLoss", "--verbose"],
        rf"{E}trainer( \(replica 0\))? failed in train_step: FloatingPointError: algorithm\.loss "
        rf"\(tests\.faults\.bad\.InfLoss\) is inf on this step's batch: the step was skipped so the weights stay "
        rf"finite \(check the loss, the rewards and algorithm\.lr\)", code=1, status="FAILED", check=report_printed),
    # 8. a reward of 1e308: FAILED naming the function, where it crashed the controller
    "8 a reward of +-1e308": Case(
        lambda w: ["reward.functions.exact._target_=tests.faults.bad.huge_reward"],
        rf"{E}reward\.functions\.exact returned -?1e\+308 \(the completion's reward: -?1e\+308\): rewards are "
        rf"carried as float32, whose range ends at ±3\.4e\+38, and their means and advantages would not be finite; "
        rf"return values well inside it", code=1, status="FAILED"),
    # 9. checkable before the start: refused then, not after the services are up
    "9 algorithm.lr=inf": Case(lambda w: ["algorithm.lr=inf"], rf"{E}algorithm\.lr must be finite, got inf"),
    "9 a seed past 64 bits": Case(lambda w: ["seed=99999999999999999999999"],
                                  rf"{E}seed must be in \[0, 9223372036854775807\], got 99999999999999999999999"),
    "9 generator=vllm without vLLM": Case(
        lambda w: no_vllm(),
        rf"{E}generator=vllm needs vLLM: .* \(no module named 'vllm' for \S+\)"),
    "9 checkpoint.dir that is a file": Case(
        lambda w: ["checkpoint.every=2", f"checkpoint.dir={a_file(w.t)}"],
        rf"{E}checkpoint\.dir=\S+a_file is a file, not a directory: give a directory"),
    "9 a read-only checkpoint.dir": Case(
        lambda w: ["checkpoint.every=2", f"checkpoint.dir={w.t}/ro/ckpt"],
        rf"{E}checkpoint\.dir=\S+/ro/ckpt: cannot write there \(Read-only file system\); give a directory this user "
        rf"can write", mounts=read_only),
    "9 a model.safetensors cut short": Case(
        lambda w: a_model(w, "weights"),
        rf"{E}model\.path=\S+model has a model\.safetensors of (\d+) bytes where its header says (\d+) \(cut short by "
        rf"a copy\?\): pass a local directory saved with save_pretrained"),
    "9 a config.json that is not JSON": Case(
        lambda w: a_model(w, "config"),
        rf"{E}model\.path=\S+model has a config\.json that is not JSON \(.*\): pass a local directory saved with "
        rf"save_pretrained"),
    # 10. the config's own lines
    "10 algorithm.loss=null": Case(
        lambda w: ["algorithm.loss=null"],
        rf"{E}algorithm\.loss must be a node with _target_ \(the option's default, conf/algorithm/grpo\.yaml\); "
        rf"leave algorithm\.loss out rather than set it to null"),
    "10 --cfg job validates as the run does": Case(
        lambda w: ["+algorithm.foo=1", "--cfg=job"], rf"{E}algorithm\.foo is not a config key; did you mean .*"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fault(tmp_path, warmstart_cache, name):
    case = CASES[name]
    with ExitStack() as stack:
        args = case.args(Where(tmp_path, stack, warmstart_cache))
        given = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith(("tracking.uri=", "hydra.run.dir="))}
        uri = given.get("tracking.uri", f"sqlite:///{tmp_path}/mlflow.db")
        run_dir = Path(given.get("hydra.run.dir", tmp_path / "run")).relative_to(tmp_path)
        overrides = [a for a in args if a.split("=", 1)[0] not in given and not a.startswith("--")]
        flags = [a for a in args if a.startswith("--")]  # after the overrides, as Hydra's parser wants them
        cmd = [*cli(tmp_path, warmstart_cache, *overrides, run=str(run_dir), uri=uri), *flags]
        if case.mounts is not None:
            cmd = stack.enter_context(Mounts(*case.mounts(tmp_path))).enter(cmd)
        run = Run(cmd, cwd=tmp_path)
        rc, out, err = run.finish(300)
    assert rc == case.code, err[-3000:]
    if case.last is not None:
        assert re.fullmatch(case.last, last_line(err)), last_line(err)
    if "--verbose" not in args:
        assert "Traceback" not in err, err[-3000:]
    if case.status is None:  # refused before anything started: that line alone, nothing spawned, no run
        assert [line for line in err.splitlines() if line.strip()] == [last_line(err)]
        assert run.seen == set(), "a process was spawned"
        assert runs_in(uri) == 0
        return
    assert run.orphans() == [], "processes left behind"
    client, r = the_run(uri)
    assert r.info.status == case.status
    assert steps(client, r.info.run_id) == list(case.steps)
    if case.check is not None:
        case.check(client, r, out, err, tmp_path)


def runs_in(uri: str) -> int:
    """How many runs a local store holds, deleted experiments' too (0 without a store)."""
    path = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if path is None or not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0]


def test_mode_eval_is_the_mode_key(tmp_path):
    """`mode=eval` said "mode is not a config key" (only `+mode=eval` worked); both spellings select it now."""
    for spelling in ("mode=eval", "+mode=eval"):
        run = Run([*cli(tmp_path, tmp_path, spelling), "--cfg", "job"], cwd=tmp_path)
        rc, out, err = run.finish(120)
        assert rc == 0 and re.search(r"^mode: eval$", out, re.M), err[-2000:]
