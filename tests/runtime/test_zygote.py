"""Procs forked from the fork server (runtime/zygote.py): the child runs actors with the client's environment and
stdio, its death is its client's death (and the other way round), the server ends with its controller, and a run
whose server is gone or unreachable starts its procs with the plain bootstrap."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from monarch.actor import Actor, endpoint, this_host

from forge_exp.config.services import ServicesConfig
from forge_exp.runtime import zygote
from forge_exp.runtime.bootstrap import bootstrap_command
from forge_exp.runtime.layout import plan_meshes
from forge_exp.runtime.services import Runtime
from forge_exp.runtime.supervision import ServiceFailed
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # each test starts a fork server and procs


class Who(Actor):
    def __init__(self, *, devices, threads):
        pass

    @endpoint
    async def who(self) -> dict:
        import torch

        return {"pid": os.getpid(), "ppid": os.getppid(), "argv": list(sys.argv), "cwd": os.getcwd(),
                "name": os.environ.get("HYPERACTOR_PROCESS_NAME", ""), "probe": os.environ.get("ZYGOTE_PROBE"),
                "sum": float(torch.arange(4.0).sum()), "monarch": "monarch._rust_bindings" in sys.modules}


@pytest.fixture
def server():
    assert zygote.start()
    yield zygote._server
    zygote.stop()


def client_of(me: dict) -> psutil.Process:
    """The process Monarch started for the proc `me` (a Who answer from a child of the server): the live client whose
    environment the child adopted, matched on the whole proc name (an earlier test's client may still be exiting)."""
    for p in psutil.Process().children(recursive=True):
        try:
            if ("zygote_client.py" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE
                    and p.environ().get("HYPERACTOR_PROCESS_NAME") == me["name"]):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no client for {me['pid']} ({me['name']})")


async def spawned(probe: str = "1") -> dict:
    os.environ["ZYGOTE_PROBE"] = probe  # set after the server started: the child must see the client's environment
    try:
        async with Runtime(plan_meshes(ServicesConfig(), {"reward"})) as runtime:
            return await runtime.spawn("reward", Who).route().who.call_one()
    finally:
        del os.environ["ZYGOTE_PROBE"]


def test_the_forked_child_runs_actors_with_the_clients_environment(server):
    me = asyncio.run(spawned("forked"))
    assert me["ppid"] == server.pid  # forked from the server, not started by Monarch
    assert me["probe"] == "forked" and me["name"].startswith("host-0") and me["cwd"] == os.getcwd()
    assert me["argv"][0].endswith("forge_exp/runtime/bootstrap.py") and me["sum"] == 6.0 and me["monarch"]
    assert server.poll() is None  # one server for every proc of the run


def test_the_server_preloads_without_monarch_threads_cuda_or_open_files():
    code = ("import os, sys; from forge_exp.runtime.zygote_server import preload; preload(); "
            "print(len(os.listdir('/proc/self/task')), 'monarch._rust_bindings' in sys.modules, "
            "'forge_exp.models.qwen3' in sys.modules, 'transformers.modeling_utils' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["1", "False", "True", "False"], out.stderr[-2000:]


def test_a_killed_child_kills_its_client_with_the_same_signal(server):
    async def main() -> ServiceFailed:
        async with Runtime(plan_meshes(ServicesConfig(), {"reward"})) as runtime:
            me = await runtime.spawn("reward", Who).route().who.call_one()
            os.kill(me["pid"], signal.SIGKILL)
            with pytest.raises(ServiceFailed) as failed:
                await runtime.supervise(asyncio.sleep(60))
            return failed.value

    # Monarch reaps the client and reports how it ended (waiting on the client here would race its reaper)
    failure = asyncio.run(main())
    assert failure.died and failure.cause == "SIGKILL", failure.report


def test_a_killed_client_takes_its_child_with_it(server):
    async def main() -> int:
        async with Runtime(plan_meshes(ServicesConfig(), {"reward"})) as runtime:
            runtime.supervisor.closing = True  # the death is on purpose here: no ServiceFailed for it
            me = await runtime.spawn("reward", Who).route().who.call_one()
            client_of(me).kill()
            try:
                psutil.Process(me["pid"]).wait(timeout=30)  # the server's child: the server reaps it
            except psutil.NoSuchProcess:
                pass
            return me["pid"]

    pid = asyncio.run(main())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_stopping_the_server_leaves_no_process_and_a_dead_one_means_the_plain_bootstrap(caplog):
    assert zygote.start()
    server = zygote._server
    server.kill()
    server.wait()
    with caplog.at_level("WARNING"):
        me = asyncio.run(spawned())
        again = asyncio.run(spawned())
    assert me["ppid"] == again["ppid"] == os.getpid()  # started by Monarch, as without a server
    assert me["argv"][0].endswith("forge_exp/runtime/bootstrap.py")
    assert sum("fork server is unavailable" in r.message for r in caplog.records) == 1  # logged once
    zygote.stop()
    assert zygote._server is None


class Nothing(Actor):
    @endpoint
    async def ppid(self) -> int:
        return os.getppid()


async def client_without_server() -> int:
    cmd = bootstrap_command()
    cmd.args = [zygote.CLIENT, "forge-exp-zygote-nobody-listens"]
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="orphan", bootstrap_command=cmd)
    try:
        return await procs.spawn("nothing", Nothing).ppid.call_one()
    finally:
        await procs.stop()


def test_a_client_that_finds_no_server_becomes_the_plain_bootstrap():
    assert asyncio.run(client_without_server()) == os.getpid()


def test_the_server_exits_when_its_controller_dies(tmp_path):
    code = ("import time; from forge_exp.runtime import zygote; zygote.start(); "
            "print(zygote._server.pid, flush=True); time.sleep(600)")
    controller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    server = psutil.Process(int(controller.stdout.readline()))
    controller.kill()
    controller.wait()
    deadline = time.time() + 10
    while time.time() < deadline and server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.1)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("before, kind", [("", "Forked"),
                                          ("threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); ",
                                           "Popen"),
                                          ("held = open('/etc/hostname'); ", "Popen"),  # a file it opened itself
                                          ("logging.getLogger().addHandler(logging.FileHandler(os.devnull)); ",
                                           "Forked")])  # a log file (Hydra's), which the forked server closes
def test_the_server_is_forked_from_a_single_threaded_controller_else_started_fresh(before, kind):
    code = (f"import logging, os, threading, time; {before}from forge_exp.runtime import zygote; zygote.start(); "
            "print(type(zygote._server).__name__, flush=True); zygote.stop()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == [kind], out.stderr[-2000:]


def test_libraries_that_start_threads_as_they_load_are_loaded_without_them():
    code = ("import os\nfrom forge_exp.runtime.zygote_server import quiet_load\nwith quiet_load():\n"
            "    import numpy, pyarrow\n"
            "print(len(os.listdir('/proc/self/task')), 'JE_ARROW_MALLOC_CONF' in os.environ)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["1", "False"], out.stderr[-2000:]  # OpenBLAS's pool, jemalloc's purging thread
    plain = subprocess.run([sys.executable, "-c", code.replace("with quiet_load():\n    ", "if True:\n    ")],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert int(plain.stdout.split()[0]) > 1  # what the settings prevent, on this machine's builds


class Daemon(Actor):
    def __init__(self, *, devices, threads):
        pass

    @endpoint
    async def start(self) -> int:
        """A daemonic child of this proc, as vLLM's engine core is of the generator: multiprocessing ends it when the
        proc exits."""
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,), daemon=True)
        child.start()
        return child.pid


def test_a_proc_forked_from_a_forked_server_ends_its_daemonic_children_as_it_exits():
    code = ("from forge_exp.runtime import zygote; zygote.start(); print(type(zygote._server).__name__)\n"
            "import asyncio\nfrom forge_exp.config.services import ServicesConfig\n"
            "from forge_exp.runtime.layout import plan_meshes\nfrom forge_exp.runtime.services import Runtime\n"
            "from tests.runtime.test_zygote import Daemon\n"
            "async def main():\n"
            "    async with Runtime(plan_meshes(ServicesConfig(), {'reward'})) as runtime:\n"
            "        return await runtime.spawn('reward', Daemon).route().start.call_one()\n"
            "print(asyncio.run(main()), flush=True)\nzygote.stop()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    kind, pid = out.stdout.split()[-2:]
    assert kind == "Forked", out.stderr[-2000:]
    deadline = time.time() + 10
    while time.time() < deadline and psutil.pid_exists(int(pid)):
        time.sleep(0.1)
    assert not psutil.pid_exists(int(pid)), "the proc's daemonic child outlived it"
