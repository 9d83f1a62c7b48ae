"""A run dir through the faults that need a run under way, one started run serving them all:

- a second `forge-exp` in the dir while the first lives, fresh or resume=true, is refused naming the owner's pid,
  and nothing of the first's is touched (2);
- its generator hangs: Ctrl-C waits for the step in flight, a second Ctrl-C stops at once, and the last line says
  so and names the newest checkpoint it leaves (10);
- its newest checkpoints are then damaged: resume=true says which and why, continues from the older intact one, and
  logs no step twice (3);
- a resume that changes what is trained is refused before anything starts; one that changes how long it runs is
  recorded (12);
- and the warm start, found in a cache moved elsewhere by a run with another eval_size, is loaded, not trained (14).
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

from tests.faults.helpers import Run, cli, last_line, steps, the_run, trained

STOPPED = (r"forge-exp: stopped by SIGINT during a step \(a second SIGINT stopped it at once\); the newest checkpoint "
           r"is (\S+) \(step (\d+)\) \(continue it with resume=true in the same run dir\)")


def test_one_owner_a_hung_stop_a_damaged_checkpoint_and_a_changed_resume(tmp_path, warmstart_cache):
    moved = tmp_path / "moved-cache"
    shutil.copytree(trained(warmstart_cache), moved / trained(warmstart_cache).name)
    uri, run_dir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    common = ["checkpoint.every=2", "checkpoint.keep=3", "checkpoint.stop_grace_s=60", "dataset.eval_size=8"]
    first = Run(cli(tmp_path, moved, "steps=40", *common))
    first.wait_for(run_dir / "checkpoints" / "step_0000004" / "metrics_flushed")

    # 2: a second start, fresh or resuming, is refused before it writes anything into the dir
    written = {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    for extra in ([], ["resume=true"]):
        second = Run(cli(tmp_path, moved, "steps=40", *common, *extra))
        rc, _, err = second.finish(120)
        assert rc == 2 and second.seen == set(), err[-2000:]
        assert re.fullmatch(rf"forge-exp: error: hydra\.run\.dir={run_dir} is in use by forge-exp pid "
                            rf"{first.proc.pid} on \S+ \(started [\d :-]+\); wait for it to end, stop it \(kill -TERM "
                            rf"{first.proc.pid}\), or give another hydra\.run\.dir", last_line(err)), err[-2000:]
    assert {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == written and first.proc.poll() is None

    # 10: the generator hangs (stopped), Ctrl-C, then Ctrl-C again
    first.service("generator").suspend()
    first.signal(signal.SIGINT)
    deadline = time.monotonic() + 60
    while "stopping after the step in flight" not in first.err:
        assert time.monotonic() < deadline and first.proc.poll() is None, first.err[-2000:]
        time.sleep(0.2)
    first.signal(signal.SIGINT)
    rc, _, err = first.finish(180)
    m = re.fullmatch(STOPPED, last_line(err))
    assert rc == 130 and m, err[-3000:]
    newest = int(m[2])
    checkpoints = run_dir / "checkpoints"
    assert Path(m[1]) == checkpoints / f"step_{newest:07d}" and newest >= 4
    assert first.orphans(wait=10) == [], "processes left behind (the stopped generator among them?)"
    # MLflow has the steps of the newest checkpoint whose metrics were sent (the stop may have come between a save
    # and its send: a resume from that one sends them)
    flushed = max(int(p.parent.name[5:]) for p in checkpoints.glob("step_*/metrics_flushed"))
    client, r = the_run(uri)
    assert r.info.status == "KILLED" and steps(client, r.info.run_id) == list(range(1, flushed + 1))
    assert not [k for k in r.data.metrics if k.startswith("warmstart/")]  # 14: loaded from the moved cache

    # 3: the checkpoints from the newest sent one on are damaged (a copy cut short, a crash before the data reached
    # the disk): the resume goes back to the one before, and the steps after it are in MLflow already
    kept = sorted(int(p.name[5:]) for p in checkpoints.glob("step_*") if p.name[5:].isdigit())
    older = max(step for step in kept if step < flushed)  # every 2 steps, plus the stop's step in flight (any step)
    damaged = {}
    for step in (step for step in kept if step >= flushed):
        weights = checkpoints / f"step_{step:07d}" / "model.safetensors"
        damaged[step] = weights.stat().st_size
        with open(weights, "r+b") as f:
            f.truncate(damaged[step] // 2)

    # 12: a resume may not change what is trained ...
    changed = Run(cli(tmp_path, moved, "steps=40", *common, "resume=true", "model.hidden_size=64"))
    rc, _, err = changed.finish(120)
    assert rc == 2 and changed.seen == set(), err[-2000:]
    assert last_line(err).startswith("forge-exp: error: resume=true: model.hidden_size=64 (the run has 128): a resume "
                                     "continues the same training; give the run's values, or start a new run")

    # ... but may run longer: recorded; and it continues from the older, intact checkpoint, no step logged twice
    total = newest + 4
    again = Run(cli(tmp_path, moved, f"steps={total}", *common, "resume=true"))
    rc, _, err = again.finish(300)
    assert rc == 0, err[-3000:]
    for step, size in damaged.items():
        assert (f"forge-exp: warning: checkpoint {checkpoints}/step_{step:07d} is damaged (model.safetensors has "
                f"{size // 2} bytes, the manifest says {size}); moved to step_{step:07d}.damaged; resuming from "
                f"step_{older:07d}") in err
    assert f"has steps {older + 1}-{flushed} already" in err
    assert (f"forge-exp: resuming from step {older} with steps: 40 -> {total} (tag forge_exp.resume.step_{older})"
            in err)
    assert again.orphans() == []
    client, r = the_run(uri)
    assert r.info.status == "FINISHED"
    for key in ("loss/total", "reward/mean", "train/version"):
        assert steps(client, r.info.run_id, key) == list(range(1, total + 1)), key
    assert r.data.tags["forge_exp.resume.step_" + str(older)] == f"steps: 40 -> {total}"
    assert r.data.tags["forge_exp.rewound"].startswith(f"steps {older + 1}-{flushed} were trained again")
    assert all((checkpoints / f"step_{step:07d}.damaged").is_dir() for step in damaged)
