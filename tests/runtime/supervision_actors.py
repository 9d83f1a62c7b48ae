"""Actors for tests/runtime/test_supervision.py (a module of its own: Monarch's processes import it by name)."""

from __future__ import annotations

import asyncio
import os
import signal

from monarch.actor import Actor, endpoint


class Worker(Actor):
    def __init__(self, fail_init: str | None = None, *, devices, threads):
        if fail_init:
            raise ValueError(fail_init)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def stop_signals(self) -> list[str]:
        """How this process treats SIGTERM, SIGUSR2 and SIGINT."""
        return [str(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)]

    @endpoint
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @endpoint
    async def boom(self) -> None:
        raise KeyError("row 7 has no 'answer'")
