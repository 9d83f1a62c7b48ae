"""Where a run's wall time goes: every service call the controller makes, as a span on the controller's clock.

    runtime.timeline                          # runtime/services.py records each `route().<endpoint>.call_one(...)`
    timeline.breakdown(start, end)            # seconds each phase was in flight in [start, end], overlap and idle
    timeline.chrome_trace()                   # the spans as Chrome trace events (Perfetto, chrome://tracing)

A phase is what a call is to the GPU-bound services (PHASES): `rollout` (generator.generate; a multi-turn run's
environment workers, which drive the generator), `reference` (ref_model.logprobs, or the trainer's own with LoRA or
trainer.hosts_reference), `train` (trainer.train_step / sft_step), `sync` (trainer.push_weights); and `score` (the
reward workers, on the host). `idle` is the time with none of rollout, reference, train and sync in flight;
`overlap` the time with rollouts and training both in flight (on one GPU they share it). A span is the call as the
controller sees it: sending, queueing in the actor and the answer's way back included.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

PHASES = {  # (service, endpoint) → phase; endpoint None: every endpoint of the service
    ("generator", "generate"): "rollout",
    ("env", None): "rollout",
    ("reward", None): "score",
    ("ref_model", "logprobs"): "reference",
    ("trainer", "logprobs"): "reference",
    ("trainer", "train_step"): "train",
    ("trainer", "sft_step"): "train",
    ("trainer", "push_weights"): "sync",
}
GPU_PHASES = ("rollout", "reference", "train", "sync")
KEEP = 100_000  # spans kept for the trace (the oldest go first); a step has tens


@dataclass
class Span:
    service: str
    endpoint: str
    start: float  # seconds on the controller's clock (time.perf_counter)
    end: float | None = None  # None: in flight

    @property
    def phase(self) -> str | None:
        return PHASES.get((self.service, self.endpoint), PHASES.get((self.service, None)))


class Timeline:
    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.spans: deque[Span] = deque(maxlen=KEEP)

    async def timed(self, service: str, endpoint: str, call):
        """Await `call` (a coroutine: one service call) as a span of `service`.`endpoint`."""
        span = Span(service, endpoint, time.perf_counter())
        self.spans.append(span)
        try:
            return await call
        finally:
            span.end = time.perf_counter()

    def breakdown(self, start: float, end: float) -> dict[str, float]:
        """timeline/<phase>_seconds for each phase, timeline/overlap_seconds and timeline/idle_seconds in
        [start, end] (perf_counter seconds); calls still in flight count up to `end`."""
        busy: dict[str, list[tuple[float, float]]] = {}
        for s in self.spans:
            lo, hi = max(s.start, start), min(s.end if s.end is not None else end, end)
            if s.phase is not None and hi > lo:
                busy.setdefault(s.phase, []).append((lo, hi))
        merged = {phase: _union(spans) for phase, spans in busy.items()}
        out = {f"timeline/{phase}_seconds": _length(merged.get(phase, [])) for phase in (*GPU_PHASES, "score")}
        out["timeline/overlap_seconds"] = _length(_intersect(merged.get("rollout", []), merged.get("train", [])))
        gpu = _union([iv for phase in GPU_PHASES for iv in merged.get(phase, [])])
        out["timeline/idle_seconds"] = max(end - start - _length(gpu), 0.0)
        return out

    def chrome_trace(self) -> dict:
        """The spans as Chrome trace-event JSON: one row per service, microseconds since the timeline began."""
        events = []
        for s in self.spans:
            if s.end is None:
                continue
            events.append({"name": s.endpoint, "cat": s.phase or "other", "ph": "X", "pid": 0, "tid": s.service,
                           "ts": round((s.start - self.origin) * 1e6, 1), "dur": round((s.end - s.start) * 1e6, 1)})
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Of two unions (sorted, disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in intervals)
