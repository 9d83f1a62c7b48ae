"""A service process that dies, an actor that cannot start and an endpoint that raises each end the run with one
ServiceFailed naming the service, on real Monarch proc meshes; the reports' formats are Monarch 0.7's."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from monarch.actor import this_host

from forge_exp.runtime.bootstrap import bootstrap_command
from forge_exp.runtime.layout import MeshPlan
from forge_exp.runtime.services import Runtime
from forge_exp.runtime.supervision import ServiceFailed, Supervisor, cause_of, parse_report
from tests.runtime.supervision_actors import Worker

# what Monarch 0.7 reports (captured from real failures)
KILLED = ("The actor <root>.<forge_exp.actors.generator.Generator generator{'replicas': 1/2, 'procs': 0/1}> and all "
          "its descendants have failed:\n  the process this actor was running on failed: Killed(sig=9)")
LOGGER = ("The actor logger-xPkT1otLNBm{'replicas': 1/2, 'procs': 0/1} and all its descendants have failed:\n"
          "  the process this actor was running on failed: Killed(sig=9)")
EXITED = ("The actor <root>.<A trainer{'replicas': 0/1, 'procs': 0/1}> and all its descendants have failed:\n"
          "  the process this actor was running on exited with non-zero code 3")
INIT = ("The actor <root>.<A dataset{'replicas': 0/1, 'procs': 0/1}> and all its descendants have failed:\n"
        "  actor explicitly aborted due to: Traceback (most recent call last):\n"
        "    File \"<dynamic-code>\", line 10, in __init__\n"
        "  ValueError: data/train.jsonl row 3: missing key 'answer'\n ")


def test_reports_are_read_into_service_point_and_cause():
    f = parse_report("generator-nRERmNfjBVu", KILLED)
    assert (f.mesh, f.point, f.cause, f.internal) == ("generator", {"replicas": 1, "procs": 0}, "SIGKILL", False)
    assert parse_report("logger-xPkT1otLNBm", LOGGER).internal
    assert parse_report("replay_buffer-AbC123xyz", KILLED).mesh == "replay_buffer"
    assert cause_of(EXITED) == "exited with code 3"
    assert cause_of(INIT) == "ValueError: data/train.jsonl row 3: missing key 'answer'"
    assert cause_of("...failed: Killed(sig=15)") == "SIGTERM"


def test_the_line_names_services_replica_and_cause():
    assert str(ServiceFailed(["generator"], {"replicas": 0, "procs": 0}, "SIGKILL", died=True)) == \
        "generator (replica 0) died: SIGKILL"
    assert str(ServiceFailed(["dataset", "reward"], {"replicas": 0}, "SIGKILL", died=True)) == \
        "dataset, reward (replica 0) died: SIGKILL"
    assert str(ServiceFailed(["trainer"], {"replicas": 0, "procs": 3}, "SIGKILL", died=True)) == \
        "trainer (replica 0, proc 3) died: SIGKILL"
    assert str(ServiceFailed(["trainer"], None, "RuntimeError: boom", endpoint="train_step")) == \
        "trainer failed in train_step: RuntimeError: boom"


def plan(replicas: int = 2) -> dict[str, MeshPlan]:
    return {"gen": MeshPlan("gen", ["generator"], replicas, 1, 0, 1, devices=[["cpu"]] * replicas)}


async def _after_kill(replica: int) -> tuple[ServiceFailed, float]:
    async with Runtime(plan()) as runtime:
        svc = runtime.spawn("generator", Worker)
        pid = await svc.replica(replica).pid.call_one()

        async def work():
            await svc.replica(0).sleep.call_one(60)  # a call in flight on the other replica too

        task = asyncio.ensure_future(runtime.supervise(work()))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ServiceFailed) as e:
            await task
        return e.value, time.monotonic() - t0


@pytest.mark.slow
def test_a_killed_process_fails_the_run_naming_service_and_replica():
    failure, seconds = asyncio.run(_after_kill(replica=1))
    assert str(failure) == "generator (replica 1) died: SIGKILL"
    assert seconds < 10, seconds  # Monarch polls every 2 s here (runtime/supervision.py)


@pytest.mark.slow
def test_an_actor_that_cannot_start_and_an_endpoint_that_raises():
    async def init_fails():
        async with Runtime(plan(1)) as runtime:
            svc = runtime.spawn("generator", Worker, "data.jsonl row 7: missing key 'answer'")
            await runtime.supervise(svc.replica(0).pid.call_one())

    with pytest.raises(ServiceFailed, match=r"^generator \(replica 0\) failed: ValueError: data\.jsonl row 7: "
                                            r"missing key 'answer'$"):
        asyncio.run(init_fails())

    async def endpoint_raises():
        async with Runtime(plan(1)) as runtime:
            svc = runtime.spawn("generator", Worker)
            await runtime.supervise(svc.replica(0).boom.call_one())

    with pytest.raises(ServiceFailed, match=r"^generator failed in boom: KeyError: \"row 7 has no 'answer'\"$"):
        asyncio.run(endpoint_raises())


@pytest.mark.slow
def test_service_processes_leave_stop_signals_to_the_controller():
    """SLURM signals every process of a job: a service ignores SIGTERM/SIGUSR2/SIGINT and keeps serving."""

    async def run():
        async with Runtime(plan(1)) as runtime:
            svc = runtime.spawn("generator", Worker)
            pid = await svc.replica(0).pid.call_one()
            for s in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
                os.kill(pid, s)
            await asyncio.sleep(1.0)
            return await runtime.supervise(svc.replica(0).stop_signals.call_one())

    assert asyncio.run(run()) == [str(signal.SIG_IGN)] * 3


def test_monarch_is_configured_before_the_first_mesh():
    """Dead processes are looked for every 2 s, and a mesh admin server would listen on loopback only."""
    from monarch.config import get_global_config

    Runtime(plan(1))
    assert os.environ["HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"] == "2s"
    assert get_global_config()["mesh_admin_addr"] == "127.0.0.1:1729"
    assert get_global_config()["mesh_proc_spawn_max_idle"] in ("120s", "2m")  # Monarch's own default is 30s


@pytest.mark.slow
def test_a_proc_that_dies_while_starting_fails_the_spawn_at_once():
    """The 2-minute start limit is a limit, not a wait: a proc whose command exits is reported as soon as it does."""
    import sys

    async def run():
        Runtime(plan(1))  # configures Monarch as a run does
        cmd = bootstrap_command()
        cmd.program, cmd.args = sys.executable, ["-c", "import sys; sys.exit(3)"]
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="dies", bootstrap_command=cmd)
        try:
            await procs.spawn("worker", Worker, devices=["cpu"], threads=1).pid.call_one()
        finally:
            await procs.stop()

    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        asyncio.run(run())
    assert time.monotonic() - t0 < 20, f"the spawn failed only after {time.monotonic() - t0:.0f} s"
    assert "exit_code: 3" in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_process_shared_by_services_names_them_all():
    async def run():
        host = {"host": MeshPlan("host", ["reward", "dataset"], 1, 1, 0, 1, devices=[["cpu"]])}
        async with Runtime(host) as runtime:
            reward = runtime.spawn("reward", Worker)
            runtime.spawn("dataset", Worker)
            os.kill(await reward.replica(0).pid.call_one(), signal.SIGKILL)
            await runtime.supervise(asyncio.sleep(60))

    with pytest.raises(ServiceFailed, match=r"^dataset, reward \(replica 0\) died: SIGKILL$"):
        asyncio.run(run())


NEVER_STARTS = """
import asyncio, sys
from monarch.actor import this_host
from monarch.config import configure
from forge_exp.runtime.bootstrap import bootstrap_command
from forge_exp.runtime.services import Runtime
from forge_exp.runtime.supervision import ServiceFailed
from tests.runtime.supervision_actors import Worker
from tests.runtime.test_supervision import plan

async def run():
    async with Runtime(plan(1)) as runtime:
        configure(mesh_proc_spawn_max_idle="3s")
        cmd = bootstrap_command()
        cmd.program, cmd.args = sys.executable, ["-c", "import time; time.sleep(60)  # " + sys.argv[1]]
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="slow", bootstrap_command=cmd)
        runtime.procs["slow"] = procs  # stopped with the runtime, as a run's meshes are
        await runtime.supervise(procs.spawn("worker", Worker, devices=["cpu"], threads=1).pid.call_one())

try:
    asyncio.run(run())
except ServiceFailed as e:
    print(e)
"""


@pytest.mark.slow
def test_a_proc_that_never_starts_is_one_line_naming_the_limit():
    """Monarch's spawn timeout (a proc that never reports in) is a ServiceFailed, not a ValueError's traceback; the
    proc it gave up on ends with the controller."""
    import subprocess
    import sys
    import uuid

    import psutil

    from tests.conftest import ROOT

    marker = f"never-starts-{uuid.uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "-c", NEVER_STARTS, marker], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip().splitlines()[-1:] == [
        "a process of the run failed: a proc did not start within 3 s (HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE sets the "
        "limit)"], out.stdout + out.stderr[-3000:]
    deadline = time.monotonic() + 10
    while left := [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]:
        assert time.monotonic() < deadline, f"the proc that never started outlived its controller: {left}"
        time.sleep(0.2)


@pytest.mark.slow
def test_events_after_the_run_are_not_printed_as_unhandled(capfd):
    """A failure's late events (polled after the meshes were stopped) are logged at debug level, not printed by
    Monarch's default hook after the run's last line (nor do they exit the controller)."""
    import monarch.actor

    from forge_exp.runtime.supervision import after_close

    async def run():
        async with Runtime(plan(1)) as runtime:
            svc = runtime.spawn("generator", Worker)
            os.kill(await svc.replica(0).pid.call_one(), signal.SIGKILL)
            await runtime.supervise(asyncio.sleep(60))

    with pytest.raises(ServiceFailed):
        asyncio.run(run())
    assert monarch.actor.unhandled_fault_hook is after_close
    time.sleep(4.5)  # two polls: any late event has come by now
    assert "Unhandled monarch error" not in capfd.readouterr().err


@pytest.mark.slow
def test_a_call_naming_the_service_wins_over_events_about_monarchs_own_meshes_only():
    """The process died, Monarch's logger mesh reported it, the service's own event did not come in time: the
    failed call's error names the service."""
    from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

    async def run(meshes: dict[str, str] | None = None):
        supervisor = Supervisor()
        supervisor.meshes.update(meshes or {})
        supervisor.install()
        try:
            supervisor._hook(type("Event", (), {"mesh_name": "logger-xPkT1otLNBm", "report": lambda self: LOGGER})())

            async def work():
                await asyncio.sleep(0.1)
                raise SupervisionError("Endpoint call trainer.train_step() failed: " + KILLED.replace("generator",
                                                                                                     "trainer"))
            await supervisor.run(work())
        finally:
            supervisor.uninstall()

    with pytest.raises(ServiceFailed, match=r"^trainer \(replica 1\) died: SIGKILL$"):
        asyncio.run(run())
    # a call to one of several services on the process that died: all of them are named, as the events would
    with pytest.raises(ServiceFailed, match=r"^ref_model, trainer \(replica 1\) died: SIGKILL$"):
        asyncio.run(run({"trainer": "gpu", "ref_model": "gpu", "generator": "other"}))


@pytest.mark.slow
def test_a_death_only_monarchs_logger_mesh_reported_names_the_local_mesh_short_of_a_process():
    """At times Monarch delivers a dead process's event for its own logger mesh only, whose name says nothing of
    the proc mesh: the proc mesh started here that has lost a process is the one named, with its services."""
    import psutil

    plans = {name: MeshPlan(name, [service], 1, 1, 0, 1, devices=[["cpu"]])
             for name, service in (("gen", "generator"), ("train", "trainer"))}

    async def run() -> tuple[str, str]:
        async with Runtime(plans) as runtime:
            generator, trainer = runtime.spawn("generator", Worker), runtime.spawn("trainer", Worker)
            pid = await generator.replica(0).pid.call_one()
            await trainer.replica(0).pid.call_one()
            assert runtime.supervisor._short_of_procs() == []  # all there
            os.kill(pid, signal.SIGKILL)
            while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                await asyncio.sleep(0.05)  # (not wait(): that would reap Monarch's child before Monarch does)
            # the logger's event alone, decided by a supervisor that sees the same meshes
            alone = Supervisor()
            alone.meshes, alone.local = dict(runtime.supervisor.meshes), dict(runtime.supervisor.local)
            alone._loop = asyncio.get_running_loop()
            alone._failed = alone._loop.create_future()
            alone._add(parse_report("logger-xPkT1otLNBm", LOGGER.replace("1/2", "0/1")))
            await asyncio.wait([alone._failed], timeout=10)
            with pytest.raises(ServiceFailed) as real:  # and the run's own supervisor, from Monarch's events
                await runtime.supervise(asyncio.sleep(30))
            return str(alone.failure), str(real.value)

    assert asyncio.run(run()) == ("generator (replica 0) died: SIGKILL",) * 2
