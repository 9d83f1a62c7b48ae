"""Full disks, on real file systems: a tmpfs in a private mount namespace (tests/faults/helpers.py: Mounts).

- The disk of checkpoint.dir fills during a save: the run stops FAILED saying the disk is full and where (torch's
  own words were "unexpected pos 425152 vs 425044"), with the steps before it in MLflow once (10).
- The disk of the sqlite store fills mid-run: the run goes on, stderr gets one warning line instead of 1,290 lines of
  SQLAlchemy tracebacks (MLflow's own report goes to a file the line names), and the next start, with room again,
  sends what was kept and finishes the run with every step once (11).
"""

from __future__ import annotations

import re

from tests.faults.helpers import Mounts, Run, cli, last_line, steps, the_run


def test_a_full_disk_during_a_save_fails_the_run_saying_so(tmp_path, warmstart_cache):
    disk = tmp_path / "disk"
    disk.mkdir()
    # a tiny model's checkpoint is ~7.2 MB (weights and AdamW's moments): the first fits, the second does not
    with Mounts(f"mount -t tmpfs -o size=10m tmpfs {disk}") as mounts:
        run = Run(mounts.enter(cli(tmp_path, warmstart_cache, "steps=8", "checkpoint.every=2", "checkpoint.keep=1",
                                   f"checkpoint.dir={disk}/ckpt")))
        rc, _, err = run.finish(300)
    assert rc == 1, err[-3000:]
    assert re.fullmatch(rf"forge-exp: error: trainer( \(replica 0\))? failed in save: OSError: \[Errno 28\] no space "
                        rf"left on device \(\d+ bytes free\) while writing {disk}/ckpt/step_0000004; free space there, "
                        rf"or write checkpoints elsewhere \(checkpoint\.dir\)", last_line(err)), err[-3000:]
    assert "Traceback" not in err and run.orphans() == []
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FAILED" and steps(client, r.info.run_id) == [1, 2]


def test_a_full_sqlite_store_is_one_warning_and_the_next_start_sends_what_was_kept(tmp_path, warmstart_cache):
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store}/mlflow.db"
    common = ["checkpoint.every=2", "tracking.close_wait_s=3"]
    with Mounts(f"mount -t tmpfs -o size=64m tmpfs {store}") as mounts:
        run = Run(mounts.enter(cli(tmp_path, warmstart_cache, "steps=12", *common, uri=uri)))
        run.wait_for(tmp_path / "run" / "checkpoints" / "step_0000002" / "metrics_flushed")
        mounts.sh(f"dd if=/dev/zero of={store}/filler bs=1M 2>/dev/null || true")  # the disk is full from here
        rc, _, err = run.finish(300)
        assert rc == 0, err[-3000:]  # the training finished; MLflow lacks its end, which the last line says
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("Monarch internal logs")]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert re.fullmatch(rf"forge-exp: warning: MLflow at {uri} did not take the run's end within 3 s "
                            rf"\(OperationalError: database or disk is full\): run \w+ is not marked FINISHED, \d+ "
                            rf"metric rows unsent; {tmp_path}/run keeps them for the next start there \(MLflow's own "
                            rf"report: {tmp_path}/run/mlflow_errors\.log\)", lines[0]), lines[0]
        assert "database or disk is full" in (tmp_path / "run" / "mlflow_errors.log").read_text()
        assert run.orphans() == []

        mounts.sh(f"rm {store}/filler")  # room again: the next start in the run dir sends what was kept
        again = Run(mounts.enter(cli(tmp_path, warmstart_cache, "steps=14", *common, "resume=true", uri=uri)))
        rc, _, err = again.finish(300)
        assert rc == 0, err[-3000:]
        assert re.search(r"forge-exp: previous run \w+ in \S+: sent \d+ metric rows it had kept, marked it FINISHED",
                         err), err[-3000:]
        assert again.orphans() == []
        mounts.sh(f"cp {store}/mlflow.db {tmp_path}/copy.db")
    client, r = the_run(f"sqlite:///{tmp_path}/copy.db")
    assert r.info.status == "FINISHED"
    for key in ("loss/total", "reward/mean", "train/version"):
        assert steps(client, r.info.run_id, key) == list(range(1, 15)), key
