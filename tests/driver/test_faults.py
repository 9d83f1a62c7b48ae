"""How a run ends when it does not finish (driver/faults.py): the reward watch, the stop request under real signals,
and the lines and exit codes the CLI prints for them."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import pytest

from forge_exp.driver.faults import NOT_STARTED, STOP_SIGNALS, RewardWatch, RunFailed, StopRequest, Stopped


def test_a_reward_failing_too_often_for_n_steps_in_a_row_is_caught_with_its_error():
    watch = RewardWatch(max_rate=0.5, steps=3)
    ok = {"reward/failed/exact": 0.0, "reward/failed/format": 0.1}
    bad = {"reward/failed/exact": 0.9, "reward/failed/format": 0.1}
    assert [watch.update(m) for m in (bad, bad, ok, bad, bad)] == [None] * 5  # a good step resets the count
    assert watch.update(bad) == ("exact", 0.9)
    err = watch.error("exact", 0.9, "TypeError: unsupported operand")
    assert str(err) == ("reward.functions.exact failed on 90% of the completions for 3 steps in a row "
                        "(reward.max_failure_rate=0.5): TypeError: unsupported operand")
    assert err.run_status == "FAILED"
    never = RewardWatch(max_rate=1.0, steps=1)
    assert never.update({"reward/failed/exact": 1.0}) is None


def test_a_reward_outside_float32_fails_the_run_naming_the_function():
    from forge_exp.apps.rollout import check_rewards
    from forge_exp.rl.types import Group, Problem

    functions = ("exact", "format")

    def group(*parts: dict) -> Group:
        return Group(Problem("1+1=", "2"), [], rewards=[sum(p.values()) for p in parts], components=list(parts))

    check_rewards(functions, [group({"exact": 1.0, "format": 0.5}, {"exact": -3e38, "format": 0.0})])  # float32: fits
    for huge in (1e308, -1e308, float("inf")):
        shown = re.escape(f"{huge:g}")
        with pytest.raises(RunFailed, match=rf"^reward\.functions\.exact returned {shown} \(the completion's reward: "
                                            rf"{shown}\): rewards are carried as float32"):
            check_rewards(functions, [group({"exact": 1.0, "format": 0.5}, {"exact": huge, "format": 0.5})])
    with pytest.raises(RunFailed, match=r"^reward\.functions\.format returned 3e\+38 \(the completion's reward: "
                                        r"5e\+38\)"):  # each finite in float32, their sum is not
        check_rewards(functions, [group({"exact": 2e38, "format": 3e38})])


def test_stopped_says_where_it_stopped_and_exits_128_plus_the_signal():
    s = Stopped(signal.SIGTERM, 7, "/runs/a/checkpoints/step_0000007")
    assert str(s) == ("stopped by SIGTERM after step 7; checkpoint /runs/a/checkpoints/step_0000007 (continue it "
                      "with resume=true in the same run dir)")
    assert (s.exit_code, s.run_status) == (143, "KILLED")
    assert Stopped(signal.SIGUSR2, 3, None).exit_code == 140
    assert "(preempted) after step 3, with no checkpoint (checkpoint.every=0)" in str(Stopped(signal.SIGUSR2, 3, None))
    assert Stopped(signal.SIGINT, None, None, "x").exit_code == 130 and str(Stopped(signal.SIGINT, None, None, "x")) \
        == "stopped by SIGINT during a step, with no checkpoint (x)"
    assert str(Stopped(signal.SIGTERM, None, None, NOT_STARTED)) == \
        "stopped by SIGTERM before its first step (the run had not started its steps)"


@pytest.mark.parametrize("signum", list(STOP_SIGNALS))
def test_a_stop_signal_is_a_request_and_the_grace_period_cancels(signum):
    """The loop sees the request between steps; one that does not come back within the grace is cancelled."""

    async def run(grace_s: float, steps: int) -> tuple[int | None, int, bool]:
        stop = StopRequest()
        stop.install(grace_s)
        stop.steps_started = True
        done, cancelled = 0, False
        try:
            os.kill(os.getpid(), signum)
            for _ in range(steps):
                if stop.requested:
                    break
                await asyncio.sleep(0.05)  # a step
                done += 1
        except asyncio.CancelledError:
            cancelled = True
        finally:
            stop.uninstall()
        return stop.requested, done, cancelled

    before = signal.getsignal(signum)
    requested, done, cancelled = asyncio.run(run(grace_s=5, steps=100))
    assert requested == signum and done <= 2 and not cancelled
    assert signal.getsignal(signum) == before  # handed back as it was

    async def slow_step(started: bool):  # a step that does not end (or a start-up): the run is cancelled
        stop = StopRequest()
        stop.install(0.2 if started else 60)
        stop.steps_started = started
        try:
            os.kill(os.getpid(), signum)
            await asyncio.sleep(30)
        finally:
            stop.uninstall()

    for started in (True, False):  # after the grace period; before the first step, at once
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(slow_step(started))
        assert time.monotonic() - t0 < 5
