"""kill -9 of any service's process ends the run within seconds: FAILED in MLflow with the cause, exit code 1, the
CLI's last line naming the service; no process is left behind; the steps logged before it are there once each, and
`resume=true` continues the same MLflow run to the end."""

from __future__ import annotations

import time

import pytest

from tests.faults.helpers import Run, cli, last_line, resume_to_the_end, steps, the_run

PREFIX = "forge-exp: error: "


def killed_mid_run(tmp_path, cache, mesh: str, *args: str) -> tuple[Run, float, list[str]]:
    cmd = cli(tmp_path, cache, "steps=16", "checkpoint.every=2", *args)
    run = Run(cmd)
    run.wait_for(tmp_path / "run" / "checkpoints" / "step_0000002" / "metrics_flushed")
    victim = run.service(mesh)
    t0 = time.monotonic()
    victim.kill()
    run.finish(120)
    return run, time.monotonic() - t0, cmd


# Under services=cpu only the generator and the trainer have processes of their own; dataset, reward and replay
# buffer live in the controller's (killing it is the controller's death: tests/faults/test_stop_signals.py).
# services=cpu_host gives the light services one process of their own, and a multi-turn run's env workers too.
@pytest.mark.parametrize("mesh, named, layout", [
    ("generator", "generator (replica 0)", "services=cpu"),
    ("trainer", "trainer (replica 0)", "services=cpu"),
    ("host", "dataset, replay_buffer, reward (replica 0)", "services=cpu_host"),  # one process for the three
])
def test_a_killed_service_fails_the_run_with_its_name(tmp_path, warmstart_cache, mesh, named, layout):
    run, seconds, cmd = killed_mid_run(tmp_path, warmstart_cache, mesh, layout)
    assert run.proc.returncode == 1, run.err[-3000:]
    assert last_line(run.err) == f"{PREFIX}{named} died: SIGKILL"
    assert "KeyboardInterrupt" not in run.err and "logger-" not in run.err
    print(f"{named}: {seconds:.1f} s from the kill to the controller's exit")  # shown by pytest -rP
    assert seconds < 20, f"{seconds:.1f} s from the kill to the end"  # ~2 s to notice, the rest is stopping
    assert run.orphans() == [], "processes left behind"
    client, r = the_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "FAILED" and r.data.tags["forge_exp.error"] == f"{named} died: SIGKILL"
    logged = steps(client, r.info.run_id)  # up to the last checkpoint, each once (later ones are re-run on resume)
    assert logged[-1] >= 2 and logged == list(range(1, logged[-1] + 1))
    if mesh != "generator":
        return
    resume_to_the_end(cmd, f"sqlite:///{tmp_path}/mlflow.db", 16)
