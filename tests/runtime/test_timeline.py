"""runtime/timeline.py: each step's breakdown of wall time into phases, overlap and idle, from the calls' spans."""

from __future__ import annotations

import asyncio

import pytest

from forge_exp.runtime.timeline import Span, Timeline


def timeline_of(*spans: tuple[str, str, float, float | None]) -> Timeline:
    t = Timeline()
    t.origin = 0.0
    t.spans.extend(Span(*s) for s in spans)
    return t


def test_phases_overlap_and_idle_within_the_window():
    t = timeline_of(
        ("generator", "generate", 0.0, 4.0),  # two calls in flight at once count once
        ("generator", "generate", 1.0, 3.0),
        ("reward", "score", 4.0, 4.5),
        ("ref_model", "logprobs", 4.5, 5.0),
        ("trainer", "train_step", 2.0, 6.0),
        ("trainer", "push_weights", 6.0, 6.5),
        ("replay_buffer", "sample", 1.5, 1.6),  # no phase: in the trace, not in the breakdown
    )
    b = t.breakdown(1.0, 8.0)  # the window cuts the first call
    assert b["timeline/rollout_seconds"] == pytest.approx(3.0)
    assert b["timeline/train_seconds"] == pytest.approx(4.0)
    assert b["timeline/overlap_seconds"] == pytest.approx(2.0)  # [2, 4]
    assert b["timeline/reference_seconds"] == pytest.approx(0.5)
    assert b["timeline/sync_seconds"] == pytest.approx(0.5)
    assert b["timeline/score_seconds"] == pytest.approx(0.5)
    assert b["timeline/idle_seconds"] == pytest.approx(1.5)  # [6.5, 8]: score runs on the host, not the GPU phases


def test_a_call_in_flight_counts_up_to_the_window_end():
    b = timeline_of(("trainer", "train_step", 0.0, None), ("env", "run", 0.5, None)).breakdown(0.0, 2.0)
    assert b["timeline/train_seconds"] == pytest.approx(2.0)
    assert b["timeline/rollout_seconds"] == pytest.approx(1.5)  # every endpoint of the environment workers
    assert b["timeline/idle_seconds"] == pytest.approx(0.0)


def test_timed_calls_become_chrome_trace_events():
    t = Timeline()

    async def call(value):
        await asyncio.sleep(0.01)
        return value

    async def main():
        return await asyncio.gather(t.timed("trainer", "train_step", call(1)), t.timed("generator", "generate", call(2)))

    assert asyncio.run(main()) == [1, 2]
    events = t.chrome_trace()["traceEvents"]
    assert [(e["tid"], e["name"], e["cat"]) for e in events] == [("trainer", "train_step", "train"),
                                                                 ("generator", "generate", "rollout")]
    assert all(e["ph"] == "X" and e["dur"] >= 9_000 and e["ts"] >= 0 for e in events)


def test_a_failing_call_still_ends_its_span():
    t = Timeline()

    async def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        asyncio.run(t.timed("trainer", "train_step", boom()))
    (span,) = t.spans
    assert span.end is not None and span.end >= span.start


def test_a_timed_replica_handed_to_another_actor_travels_untimed():
    import cloudpickle

    from forge_exp.runtime.services import _Timed

    t = Timeline()
    timed = _Timed(["a replica"], "generator", t)
    assert cloudpickle.loads(cloudpickle.dumps(timed)) == ["a replica"]
    with pytest.raises(AttributeError):
        timed.__setstate__
