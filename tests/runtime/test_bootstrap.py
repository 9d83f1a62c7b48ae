"""Procs start through forge_exp.runtime.bootstrap and end with fast_exit: the atexit hooks and the buffered output
survive the exit that skips interpreter finalization."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from monarch.actor import Actor, endpoint

from forge_exp.config.services import ServicesConfig
from forge_exp.runtime.bootstrap import BOOTSTRAP_MODULE
from forge_exp.runtime.layout import plan_meshes
from forge_exp.runtime.services import Runtime


def test_fast_exit_runs_atexit_hooks_flushes_and_keeps_the_code():
    code = ("import atexit, sys; atexit.register(lambda: print('hook ran')); sys.stdout.write('buffered '); "
            "from forge_exp.runtime.bootstrap import fast_exit; fast_exit(3)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert r.stdout == "buffered hook ran\n"


class Argv(Actor):
    def __init__(self, *, devices, threads):
        pass

    @endpoint
    async def argv(self) -> list[str]:
        return list(sys.argv)


async def spawned_argv() -> list[str]:
    async with Runtime(plan_meshes(ServicesConfig(), {"reward"})) as runtime:
        return await runtime.spawn("reward", Argv).route().argv.call_one()


def test_procs_start_through_the_bootstrap_module():
    argv = asyncio.run(spawned_argv())
    assert argv and argv[0].endswith("bootstrap.py") and BOOTSTRAP_MODULE.replace(".", "/") in argv[0]
