"""A service that dies or raises ends the run with one error naming the service, its replica and the cause.

Monarch reports a failure it cannot hand to a caller (an actor whose `__init__` raised, a process that died: any
signal, an OOM kill, an exit) as a supervision event on the client, through `monarch.actor.unhandled_fault_hook`.
Its default exits the controller by raising KeyboardInterrupt in the main thread: a crash then looks like Ctrl-C, and
the first event is often about Monarch's own `logger-…` mesh on that process, not the service. `Supervisor`
replaces the hook while a run is up: it gathers the events of one failure for a moment (a process that dies fails
every actor mesh on it at once), names the services that were on it, and cancels the app with `ServiceFailed`.
An exception an endpoint raised reaches its caller as monarch's ActorError; `named()` turns it into the same error.

Monarch notices a dead process on its next poll: every HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY, 10 s by default;
`configure_monarch()` makes it 2 s unless the environment sets it (a poll is one small message per proc mesh).
It also gives a proc 2 minutes to start (HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE, Monarch's default 30 s): several runs
started together on a small machine can each take longer than 30 s to bring up a proc that imports torch, and a
proc that dies while starting is reported at once either way (tests/runtime/test_supervision.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from dataclasses import dataclass
from typing import Any, Awaitable, Iterable, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_ENV = "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"
POLL_DEFAULT = "2s"
SPAWN_ENV = "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE"
SPAWN_DEFAULT = "120s"
SPAWN_FAILED = "error spawning proc mesh"  # Monarch 0.7's ValueError, e.g. "...: statuses: Timeout(120.0s)=0..1"
ADMIN_ENV = "HYPERACTOR_MESH_ADMIN_ADDR"
ADMIN_LOOPBACK = "127.0.0.1:1729"  # Monarch's default is [::]:1729: every interface of a shared node
PROC_NAME_ENV = "HYPERACTOR_PROCESS_NAME"  # what Monarch sets for each proc it starts: "generator-0 @ <host>"
GATHER_S = 0.3  # after the first event of a failure, how long its siblings (other meshes of the process) may take
# An event about Monarch's own meshes only: how long to wait for the service's own event. Each actor mesh is polled
# on its own, so the service's can come a poll period (2 s) after the logger's, later on busy cores.
INTERNAL_WAIT_S = 4.0
CANCEL_WAIT_S = 10.0  # how long the app may take to unwind once cancelled, before the meshes are stopped under it


def configure_monarch() -> None:
    """Before the first proc mesh: poll for dead processes every 2 s, give a proc 2 minutes to start, and keep the
    mesh admin server (when one is started) on loopback. Each can be set through its environment variable instead."""
    os.environ.setdefault(POLL_ENV, POLL_DEFAULT)
    from monarch.config import configure

    if not os.environ.get(ADMIN_ENV):
        configure(mesh_admin_addr=ADMIN_LOOPBACK)
    if not os.environ.get(SPAWN_ENV):
        configure(mesh_proc_spawn_max_idle=SPAWN_DEFAULT)
    from monarch._rust_bindings.monarch_hyperactor.config import reload_config_from_env

    reload_config_from_env()  # the poll frequency is read from the environment only


@dataclass(frozen=True)
class Failure:
    """One supervision event, parsed: which actor mesh, which point of it, why."""

    mesh: str  # the actor mesh's name as spawned: the service ("generator"), or Monarch's own ("logger")
    point: dict[str, int]  # {"replicas": 0, "procs": 0}
    cause: str  # "SIGKILL", "exited with code 3", or the exception's last line "ValueError: ..."
    report: str

    @property
    def internal(self) -> bool:
        return self.mesh in INTERNAL_MESHES


INTERNAL_MESHES = {"logger"}


class ServiceFailed(RuntimeError):
    """A service's process died or its code raised: `str()` is the one line the CLI prints."""

    def __init__(self, services: list[str], point: dict[str, int] | None, cause: str, report: str = "",
                 died: bool = False, endpoint: str | None = None):
        self.services, self.point, self.cause, self.report = services, point or {}, cause, report
        self.died, self.endpoint = died, endpoint
        super().__init__(self.line())

    def line(self) -> str:
        who = ", ".join(self.services) if self.services else "a process of the run"
        where = [f"{'replica' if k == 'replicas' else 'proc' if k == 'procs' else k} {v}"
                 for k, v in self.point.items() if k == "replicas" or v]
        what = "died" if self.died else f"failed in {self.endpoint}" if self.endpoint else "failed"
        place = f" ({', '.join(where)})" if where else ""
        return f"{who}{place} {what}: {self.cause}"


def parse_report(mesh_name: str, report: str) -> Failure:
    """A MeshFailure's mesh name and report → Failure. Pure: the formats are Monarch 0.7's (tests/faults has them)."""
    mesh = re.sub(r"-[A-Za-z0-9]{6,}$", "", mesh_name)
    m = re.search(r"\{([^{}]*)\}", report.splitlines()[0] if report else "")
    point = {k: int(v) for k, v in re.findall(r"'(\w+)':\s*(\d+)/\d+", m.group(1))} if m else {}
    return Failure(mesh, point, cause_of(report), report)


def cause_of(report: str) -> str:
    """The reason in a report: a signal's name, an exit code, or the last line of the traceback."""
    m = re.search(r"Killed\(sig=(\d+)\)", report)
    if m:
        try:
            return signal.Signals(int(m.group(1))).name
        except ValueError:
            return f"signal {m.group(1)}"
    m = re.search(r"exited with non-zero code (-?\d+)", report)
    if m:
        return f"exited with code {m.group(1)}"
    lines = [line.strip() for line in report.splitlines() if line.strip() and not line.strip().startswith(")")]
    return lines[-1] if lines else "unknown failure"


def named(exc: BaseException) -> ServiceFailed | None:
    """A monarch error from an endpoint call, as a ServiceFailed (None for any other exception)."""
    kind = type(exc).__name__
    if kind == "ActorError":  # the endpoint's own exception, re-raised here
        inner = getattr(exc, "exception", None)
        inner_named = named(inner) if inner is not None else None
        if inner_named is not None:  # it was calling a service that had died (e.g. push_weights → a generator)
            return inner_named
        m = re.search(r"Actor call (\w+)\.(\w+) failed", str(exc))
        cause = f"{type(inner).__name__}: {inner}" if inner is not None else str(exc).splitlines()[0]
        return ServiceFailed([m.group(1)] if m else [], None, cause.splitlines()[0] if cause else kind,
                             getattr(exc, "exception_formatted", str(exc)), endpoint=m.group(2) if m else None)
    if isinstance(exc, ValueError) and str(exc).startswith(SPAWN_FAILED):  # a proc mesh that did not come up
        m = re.search(r"Timeout\(([\d.]+)s\)", str(exc))
        cause = (f"a proc did not start within {float(m.group(1)):.0f} s ({SPAWN_ENV} sets the limit)" if m
                 else str(exc).splitlines()[0])
        return ServiceFailed([], None, cause, str(exc))
    if kind == "SupervisionError":  # a call to an actor that had failed
        text = str(exc)
        m = re.search(r"Endpoint call (\w+)\.\w+\(\) failed", text)
        point = re.search(r"\{[^{}]*\}", text)
        failure = parse_report(m.group(1) if m else "", f"{point.group(0) if point else ''}\n{text}")
        return ServiceFailed([failure.mesh] if m else [], failure.point, failure.cause, text,
                             died=_is_death(failure.cause))
    return None


def _is_death(cause: str) -> bool:
    return cause.startswith(("SIG", "signal ", "exited with code"))


class Supervisor:
    """While installed, supervision events fail the task given to `run()` with one ServiceFailed."""

    def __init__(self) -> None:
        self._events: list[Failure] = []
        self._failed: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._decide_at: asyncio.TimerHandle | None = None
        self.closing = False  # set while the meshes are stopped on purpose: their events are expected
        self.meshes: dict[str, str] = {}  # service → the proc mesh it was spawned on (Runtime.spawn says)
        self.local: dict[str, int] = {}  # proc mesh started on this host → how many processes it has

    def install(self) -> None:
        import monarch.actor

        self._loop = asyncio.get_running_loop()
        self._failed = self._loop.create_future()
        monarch.actor.unhandled_fault_hook = self._hook

    def uninstall(self) -> None:
        """Events that come after this (a failure's late siblings, polled after the meshes were stopped) are about
        meshes the run no longer has: they are logged at debug level. Monarch's own hook would print each as an
        "Unhandled monarch error" after the run's last line, or exit the process while the tracker closes."""
        import monarch.actor

        if monarch.actor.unhandled_fault_hook == self._hook:
            monarch.actor.unhandled_fault_hook = after_close
        if self._decide_at is not None:
            self._decide_at.cancel()

    @property
    def failure(self) -> ServiceFailed | None:
        f = self._failed
        return f.exception() if f is not None and f.done() and not f.cancelled() else None

    def _hook(self, failure: Any) -> None:
        """Runs on Monarch's thread. Returning normally tells Monarch the fault is handled."""
        try:
            event = parse_report(failure.mesh_name, failure.report())
        except Exception as e:  # noqa: BLE001 — never let the hook raise: that is the KeyboardInterrupt path
            event = Failure("", {}, f"unreadable supervision event ({e})", "")
        log.debug("supervision event: %s", event.report)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._add, event)
            except RuntimeError:  # the loop closed in between
                pass

    def _add(self, event: Failure) -> None:
        if self.closing or self._failed is None or self._failed.done():
            return
        first = not self._events
        self._events.append(event)
        if first or (not event.internal and all(e.internal for e in self._events[:-1])):
            if self._decide_at is not None:
                self._decide_at.cancel()
            wait = INTERNAL_WAIT_S if event.internal else GATHER_S
            self._decide_at = self._loop.call_later(wait, self._decide)

    def _decide(self) -> None:
        if self._failed is None or self._failed.done():
            return
        named_events = [e for e in self._events if not e.internal] or self._events
        first = named_events[0]
        same = [e for e in named_events if e.point == first.point and e.cause == first.cause]
        services = list(dict.fromkeys(e.mesh for e in same if not e.internal))
        died = _is_death(first.cause)
        if died and not services:  # only Monarch's own meshes reported it: the local mesh that lost a process
            services = self._short_of_procs()
        services = self._colocated(services) if died else services
        self._failed.set_exception(ServiceFailed(services, first.point, first.cause, first.report, died=died))

    def _colocated(self, services: list[str]) -> list[str]:
        """A process that died: every service that was on it went with it."""
        if services and services[0] in self.meshes:
            mesh = self.meshes[services[0]]
            return sorted(s for s, m in self.meshes.items() if m == mesh)
        return services

    def _short_of_procs(self) -> list[str]:
        """The services of the one local proc mesh with fewer live processes than it was started with ([] when
        none or several are). Monarch reports a death on every actor mesh of the process, but at times only its
        own logger mesh's event comes, whose name says nothing of the proc mesh; each process Monarch starts here
        carries `<proc mesh>-<rank> @ <host>` in HYPERACTOR_PROCESS_NAME (a forked proc's client dies with it)."""
        short = [mesh for mesh, n in live_procs(self.local).items() if n < self.local[mesh]]
        return sorted(s for s, m in self.meshes.items() if m == short[0]) if len(short) == 1 else []

    async def run(self, work: Awaitable[T]) -> T:
        """Await `work`; if a service fails first, cancel it and raise that failure. An exception `work` raises
        that names a service (a monarch error) is raised as ServiceFailed, the event's wording preferred."""
        if self._failed is None:  # not installed (a Runtime used without `async with`): nothing to watch
            return await work
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait([task, self._failed], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the run itself was cancelled (a stop signal's grace ran out)
            task.cancel()
            await asyncio.wait([task], timeout=CANCEL_WAIT_S)
            raise
        if not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=CANCEL_WAIT_S)
            raise self.failure
        error = task.exception() if not task.cancelled() else None
        if error is None:
            return task.result()
        failure = named(error)
        if failure is None and not _mentions_monarch(error):
            raise error
        if self._events or (failure is not None and failure.died) or failure is None:
            await asyncio.wait([self._failed], timeout=INTERNAL_WAIT_S + GATHER_S)  # the event says it better
        chosen = self.failure
        if failure is not None and failure.services and (chosen is None or not chosen.services):
            # the call names the service where the events did not (Monarch's own meshes only), or there were none
            chosen = failure if not failure.died else ServiceFailed(
                self._colocated(failure.services), failure.point, failure.cause, failure.report, died=True)
        elif chosen is None:
            chosen = failure
        if chosen is not None:
            raise chosen from error
        raise error


def live_procs(meshes: Iterable[str]) -> dict[str, int]:
    """How many processes of each of `meshes` (proc mesh names) are alive among this process's descendants."""
    import psutil

    count = dict.fromkeys(meshes, 0)
    for proc in psutil.Process().children(recursive=True):
        try:
            name = proc.environ().get(PROC_NAME_ENV, "")
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
        mesh = re.sub(r"-\d+$", "", name.split(" ")[0])
        if mesh in count:
            count[mesh] += 1
    return count


def after_close(failure: Any) -> None:
    """The fault hook once a run's meshes are stopped: what is reported then is expected (Supervisor.uninstall)."""
    try:
        log.debug("supervision event after the run's meshes were stopped: %s", failure.report())
    except Exception:  # noqa: BLE001 — a hook must not raise (Monarch would take it as unhandled)
        pass


def _mentions_monarch(error: BaseException) -> bool:
    return type(error).__module__.startswith("monarch")
