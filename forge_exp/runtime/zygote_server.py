"""The fork server: one process per run that imports what every proc imports (torch, the tiny model's modeling code,
forge_exp's model, data and RL code) once, then forks a child for each proc that a client (runtime/zygote_client.py)
asks for. The child takes over the client's environment, cwd and file descriptors and runs runtime/bootstrap.py's
`main` exactly as a freshly started proc does. Children share the server's pages copy-on-write.

What makes the fork safe, and must stay so:
- nothing here initialises CUDA or imports Monarch (its Rust runtime starts threads on import; the child imports
  it, after the fork), and no preloaded module keeps a file open (a child adopts its client's descriptors onto the
  same numbers): `preload` checks all three and the server stops if any happened;
- no thread runs at fork time: the loop is one thread (selectors + a SIGCHLD wake-up pipe), and the libraries that
  start threads as they load are loaded without (`quiet_load`: OpenBLAS's pool, pyarrow's jemalloc purging thread);
  torch's own thread pools start on first use, in the child;
- the server's sockets are closed in the child through their Python objects before it adopts the client's fds.

Lifetime: the server exits when its stdin (a pipe from the controller) closes, i.e. when the controller stops it
or dies in any way; it also has a parent-death signal. A child has a parent-death signal too (so no child outlives
the server), and the server kills a child whose client is gone (`kill -9` of the client ends the proc). A child
runs in a process group of its own, which the server kills as the child ends (`end_proc`): what the proc started
ends with it, as with a proc Monarch starts itself.

    python -m forge_exp.runtime.zygote_server <socket name>     # started by runtime/zygote.py
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# What every proc of the embedded default imports (runtime/bootstrap.py's procs: trainer, generator, and the light
# services on services=cpu_host). A module missing here costs only its own import in the child; one that imports
# monarch or initialises CUDA must not be here (preload checks).
PRELOAD = (
    "torch",
    "transformers",
    "forge_exp.models.qwen3",
    "safetensors.torch",
    "hydra.utils",
    "omegaconf",
    "forge_exp.runtime.build",
    "forge_exp.models.tiny",
    "forge_exp.models.hf",
    "forge_exp.models.generate",
    "forge_exp.models.logprobs",
    "forge_exp.models.checkpoint",
    "forge_exp.models.warmstart",
    "forge_exp.models.sampling",
    "forge_exp.rl.types",
    "forge_exp.rl.replay",
    "forge_exp.rewards.combine",
    "forge_exp.generators.base",
    "forge_exp.trainers.update",
)


def parent_death_signal(signum: int) -> None:
    """Die of `signum` when the parent exits (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


# Libraries that start threads as they load, and the settings that load them without (a process with threads is not
# safe to fork): OpenBLAS's pool (numpy, scipy) and jemalloc's background purging thread (pyarrow's allocator).
QUIET_LOAD = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


@contextlib.contextmanager
def quiet_load():
    """Imports inside load those libraries without their threads; the environment is restored after."""
    saved = {key: os.environ.get(key) for key in QUIET_LOAD}
    os.environ.update(QUIET_LOAD)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


def fork_safe(own: tuple[int, ...] = ()) -> str | None:
    """Why this process is not safe to fork from (monarch imported, CUDA initialised, more than one thread, files it
    opened itself), or None. (A CUDA torch that counted the GPUs has the driver's threads running: the thread count
    says so.) `own`: descriptors the caller closes in the child itself."""
    torch = sys.modules.get("torch")
    threads = len(os.listdir("/proc/self/task"))
    files = held_files(own)
    why = [("monarch imported", "monarch._rust_bindings" in sys.modules),
           ("CUDA initialised", torch is not None and torch.cuda.is_initialized()),
           (f"{threads} threads", threads != 1),
           (f"files open: {', '.join(files)}", bool(files))]
    return ", ".join(what for what, bad in why if bad) or None


def held_files(own: tuple[int, ...] = ()) -> list[str]:
    """What this process opened itself and still holds (close-on-exec descriptors: Python opens files so), other
    than `own` and logging's file handlers (Hydra's log file), which the forked child closes through their objects.

    A forked child cannot keep these: it closes every descriptor it did not get from its client, and the Python
    object that owned one (an sqlite connection, say) would one day close that number again, when it may be the
    child's socket or one of its client's pipes."""
    import logging

    logs = set()
    for logger in [logging.root, *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.FileHandler) and stream is not None and not stream.closed:
                logs.add(stream.fileno())
    held = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd in own or fd in logs:
            continue
        try:
            if fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                held.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return held


def preload(own: tuple[int, ...] = ()) -> None:
    """Import PRELOAD, then check that what it left is safe to fork from (`own`: the server's own descriptors)."""
    with quiet_load():
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError as e:  # an optional dependency: the child imports what it needs itself
                print(f"forge-exp fork server: not preloaded: {name} ({e})", file=sys.stderr)
    if why := fork_safe(own):
        raise RuntimeError(f"the fork server is not safe to fork from ({why})")


def end_proc(pid: int) -> None:
    """Kill a forked proc and every process of its process group (its own, set as it starts: what it started, such as
    vLLM's engine core, unless that made a group of its own), as Monarch ends a proc it started and its group."""
    for kill in (os.kill, os.killpg):  # os.kill too: a child killed before it made its group
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(30)
    head, fds, _, _ = socket.recv_fds(conn, 4, 253)
    if len(head) < 4:
        head += conn.recv(4 - len(head), socket.MSG_WAITALL)
    (size,) = struct.unpack("!I", head)
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        body += chunk
    conn.settimeout(None)
    return json.loads(body), fds


class Server:
    def __init__(self, name: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind("\0" + name)
        self.listener.listen(64)  # clients that connect while preload runs wait in the backlog
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.children: dict[int, socket.socket] = {}

    def descriptors(self) -> tuple[int, ...]:
        """The server's own: a forked child closes them through their objects (become_proc)."""
        return (self.listener.fileno(), self.selector.fileno(), self.wake_r, self.wake_w)

    def serve(self) -> None:
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up fd is written
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(0, selectors.EVENT_READ, "stdin")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self.accept()
                elif key.data == "stdin":
                    if not os.read(0, 4096):  # the controller closed it or died
                        return
                elif key.data == "wake":
                    os.read(self.wake_r, 4096)
                else:  # a client's socket: readable only when the client is gone
                    self.client_gone(key.data)
            self.reap()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            request, fds = read_request(conn)
        except (OSError, ValueError) as e:
            print(f"forge-exp fork server: bad request: {e}", file=sys.stderr)
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            try:
                self.become_proc(request, fds, conn)
            finally:
                os._exit(1)  # never back into the server's loop
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            pass  # the client is gone: client_gone kills the child
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def client_gone(self, pid: int) -> None:
        end_proc(pid)
        conn = self.children.get(pid)
        if conn is not None:
            self.selector.unregister(conn)  # it stays open until the child is reaped (reap)

    def forget(self, conn: socket.socket) -> None:
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):  # already, by client_gone
            pass
        conn.close()

    def reap(self) -> None:
        while self.children:
            try:  # look first, reap after: a child not yet reaped keeps its pid, so its group is killed, not a reuse
                ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if ended is None:
                return
            if ended.si_pid in self.children:
                end_proc(ended.si_pid)  # what the proc started (vLLM's engine core...) ends with it
            pid, status = os.waitpid(ended.si_pid, 0)
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            what = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {code}"
            try:
                conn.sendall(f"{what}\n".encode())
            except OSError:
                pass
            self.forget(conn)

    def become_proc(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """In the forked child: drop the server's state, adopt the client's, run the proc's bootstrap."""
        server = os.getppid()
        parent_death_signal(signal.SIGKILL)
        if os.getppid() != server:  # the server died before the signal was armed
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        self.listener.close()
        for c in [conn, *self.children.values()]:
            c.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        # the client's descriptors onto the same numbers (via numbers above all of them, so none is overwritten)
        targets = request["fds"]
        high = max([*targets, *fds, 2]) + 1
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for fd in fds]
        for fd in fds:
            os.close(fd)
        for target, fd in zip(targets, moved):
            os.dup2(fd, target, inheritable=True)
            os.close(fd)
        os.setpgid(0, 0)  # its own process group, as Monarch gives a proc it starts
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # its name in ps/top/psutil: the proc's (e.g. "generator-0"), as its command line is the server's
        name = os.environ.get("HYPERACTOR_PROCESS_NAME", "").split(" ")[0].encode()[:15]
        if name:
            ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
        if "numpy" in sys.modules:  # numpy seeded its global generator in the server: one stream per process
            sys.modules["numpy"].random.seed()
        from forge_exp.runtime import bootstrap

        sys.argv = [bootstrap.__file__]
        bootstrap.main()


def run(name: str) -> None:
    """Be the fork server named `name` until the controller closes stdin; never returns."""
    parent_death_signal(signal.SIGKILL)  # the controller's death (stdin's EOF covers the rest)
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):  # stop signals are the controller's to act on
        signal.signal(signum, signal.SIG_IGN)
    server = Server(name)
    preload(server.descriptors())
    # the preloaded objects out of the collector's reach: a collection in a child would otherwise write to (and so
    # copy) every page holding them (https://docs.python.org/3/library/gc.html#gc.freeze)
    gc.collect()
    gc.freeze()
    server.serve()
    for pid in list(server.children):  # the controller is gone or done: its procs go with it
        end_proc(pid)
    os._exit(0)  # nothing to finalize (see runtime/bootstrap.py)


def main() -> None:
    run(sys.argv[1])


if __name__ == "__main__":
    main()
