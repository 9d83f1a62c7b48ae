"""What SLURM sends (SIGTERM at scancel or a time limit, SIGUSR2 ahead of preemption with --signal) and Ctrl-C:
the step in flight ends, a checkpoint is written, the meshes stop, the run is KILLED with the reason and the exit
code is 128 + the signal; resume=true continues it. A controller killed with SIGKILL takes its services with it,
and the next start in its run dir closes the run it left RUNNING."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from tests.faults.helpers import Run, cli, kill_all, last_line, resume_to_the_end, steps, the_run

STOPPED = (r"forge-exp: stopped by {sig}{pre} after step (\d+); checkpoint (\S+) \(continue it with resume=true in "
           r"the same run dir\)")


def started(tmp_path, cache, *args: str, every: int = 4) -> tuple[Run, list[str]]:
    cmd = cli(tmp_path, cache, "steps=20", f"checkpoint.every={every}", *args)
    run = Run(cmd)
    run.wait_for(tmp_path / "run" / "checkpoints" / f"step_{every:07d}" / "metrics_flushed")
    time.sleep(1.0)  # a step or two more, so the stop lands between checkpoints
    return run, cmd


def stopped_at(run: Run, sig: str, pre: str = "") -> int:
    m = re.fullmatch(STOPPED.format(sig=sig, pre=re.escape(pre)), last_line(run.err))
    assert m, run.err[-3000:]
    step = int(m[1])
    assert Path(m[2]).name == f"step_{step:07d}" and (Path(m[2]) / "loop.json").is_file()
    return step


def test_sigterm_checkpoints_the_step_boundary_and_resume_finishes_the_run(tmp_path, warmstart_cache):
    run, cmd = started(tmp_path, warmstart_cache)
    run.signal(signal.SIGTERM)
    rc, _, err = run.finish(120)
    assert rc == 143, err[-3000:]
    step = stopped_at(run, "SIGTERM")
    assert run.orphans() == []
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "KILLED" and r.data.tags["forge_exp.stop"].startswith("stopped by SIGTERM")
    assert steps(client, r.info.run_id) == list(range(1, step + 1))  # everything up to the stop, once

    client, r = resume_to_the_end(cmd, f"sqlite:///{tmp_path}/mlflow.db", 20)
    assert [m.value for m in sorted(client.get_metric_history(r.info.run_id, "train/version"),
                                    key=lambda m: m.step)] == [float(s) for s in range(1, 21)]


def test_a_signal_to_every_process_of_the_job_still_checkpoints(tmp_path, warmstart_cache):
    """SLURM signals the whole job: the service processes leave the signal to the controller and keep serving."""
    run, _ = started(tmp_path, warmstart_cache)
    kill_all(run, signal.SIGUSR2)  # sbatch --signal=USR2@<seconds>: notice before preemption or the time limit
    rc, _, err = run.finish(120)
    assert rc == 140, err[-3000:]
    stopped_at(run, "SIGUSR2", " (preempted)")
    assert run.orphans() == []
    assert the_run(f"sqlite:///{tmp_path}/mlflow.db")[1].info.status == "KILLED"


def training(run: Run, uri: str, timeout: float = 300) -> None:
    """Wait until the run has logged steps (without checkpoints: every 10 steps)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        run.children()
        assert run.proc.poll() is None, "ended before its first logged step: " + run.finish(0)[2][-3000:]
        try:
            client, r = the_run(uri)
            if steps(client, r.info.run_id):
                return
        except ValueError:  # no run yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"no step logged within {timeout} s: " + run.err[-3000:])


def test_ctrl_c_without_checkpoints_is_killed_with_every_step_logged(tmp_path, warmstart_cache):
    run = Run(cli(tmp_path, warmstart_cache, "steps=400"))
    training(run, f"sqlite:///{tmp_path}/mlflow.db")
    run.signal(signal.SIGINT)
    rc, _, err = run.finish(120)
    assert rc == 130, err[-3000:]
    m = re.fullmatch(r"forge-exp: stopped by SIGINT after step (\d+), with no checkpoint \(checkpoint\.every=0\)",
                     last_line(err))
    assert m, err[-2000:]
    assert run.orphans() == []
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "KILLED" and steps(client, r.info.run_id) == list(range(1, int(m[1]) + 1))


def test_a_step_that_outlasts_the_grace_period_stops_naming_the_newest_checkpoint(tmp_path, warmstart_cache):
    run, cmd = started(tmp_path, warmstart_cache, "checkpoint.stop_grace_s=0")
    run.signal(signal.SIGTERM)
    rc, _, err = run.finish(120)
    assert rc == 143, err[-3000:]
    m = re.fullmatch(r"forge-exp: stopped by SIGTERM during a step \(the step in flight did not end within "
                     r"checkpoint\.stop_grace_s=0\); the newest checkpoint is (\S+) \(step (\d+)\) \(continue it "
                     r"with resume=true in the same run dir\)", last_line(err))
    assert m, err[-3000:]  # (the periodic checkpoints stand: it said "with no checkpoint")
    assert run.orphans() == []
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    logged = steps(client, r.info.run_id)
    assert r.info.status == "KILLED" and logged == list(range(1, logged[-1] + 1)) and logged[-1] % 4 == 0
    assert Path(m[1]).name == f"step_{logged[-1]:07d}" and int(m[2]) == logged[-1]


def test_a_signal_while_the_services_start_stops_at_once(tmp_path, warmstart_cache):
    run = Run(cli(tmp_path, warmstart_cache, "steps=20", "checkpoint.every=4"))
    run.service("generator")  # building: nothing to checkpoint yet
    t0 = run.signal(signal.SIGTERM)
    rc, _, err = run.finish(120)
    assert rc == 143, err[-3000:]
    assert last_line(err) == "forge-exp: stopped by SIGTERM before its first step (the run had not started its steps)"
    assert time.monotonic() - t0 < 20 and run.orphans() == []
    assert the_run(f"sqlite:///{tmp_path}/mlflow.db")[1].info.status == "KILLED"


def test_a_sigkilled_controller_leaves_no_process_and_its_run_is_closed_by_the_next_start(tmp_path, warmstart_cache):
    run, cmd = started(tmp_path, warmstart_cache)
    run.signal(signal.SIGKILL)
    run.finish(60)
    assert run.orphans(wait=10) == [], "services outlived their controller"
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "RUNNING"  # nobody could say otherwise, yet

    again = Run([*cmd, "resume=true"])
    rc, _, err = again.finish(300)
    assert rc == 0, err[-3000:]
    assert f"forge-exp: previous run {r.info.run_id} in {tmp_path / 'run'}: marked it KILLED" in err
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FINISHED"
    assert steps(client, r.info.run_id) == list(range(1, 21))
