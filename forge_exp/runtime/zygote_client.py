"""The command Monarch runs for a proc when the run has a fork server (runtime/zygote.py): it hands this process's
environment, cwd and open file descriptors to the server, which forks a pre-imported child that becomes the proc,
and then stands in for that child until it ends, exiting the way the child did (its exit code, or the same signal).

Monarch sees this process as the proc: it started it, it waits for it and kills it. The child follows it: the
server kills the child (SIGKILL) when this process's end of the socket closes, so `kill -9` of this process ends
the proc as it would end a plain one; and a child that dies makes this process die of the same signal.

Run by path, not as a module, and with the standard library only: every import here is start-up time of every proc.
When the server cannot be reached, or it closes the connection before forking, this process becomes the plain
bootstrap (runtime/bootstrap.py) itself, so a proc starts either way.

    python .../forge_exp/runtime/zygote_client.py <socket name>
"""

import json
import os
import signal
import socket
import struct
import sys
import time

PLAIN = [sys.executable, "-m", "forge_exp.runtime.bootstrap"]


def open_fds() -> list[int]:
    """The descriptors this process inherited (Monarch's stdio pipes and whatever else it passed down)."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))  # the directory listing's own descriptor is closed by now
        except OSError:
            continue
        fds.append(int(name))
    return sorted(fds)


def plain(why: str) -> None:
    print(f"forge-exp: fork server unavailable ({why}); starting this proc with the plain bootstrap", file=sys.stderr)
    sys.stderr.flush()
    os.execv(PLAIN[0], PLAIN)


def relay(status: str) -> None:
    """Exit as the child did: `exit N` or `signal S`."""
    kind, _, value = status.partition(" ")
    if kind == "signal":
        signum = int(value)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # (those two cannot be caught or ignored anyway)
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default is to be ignored (SIGCHLD, SIGWINCH...)
    os._exit(int(value) if kind == "exit" else 1)


def connect(sock: socket.socket, address: str, wait_s: float = 10.0) -> None:
    """Connect, waiting for a server that is still starting (it binds ~0.1 s after the controller starts it, more
    on cores busy with the controller's own imports; the controller only hands out this command while the server
    runs, so the wait ends either way)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock.connect(address)
            return
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def main() -> None:
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):  # as runtime/bootstrap.py: the controller's to act on
        signal.signal(signum, signal.SIG_IGN)
    fds = open_fds()
    request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connect(sock, "\0" + sys.argv[1])
        socket.send_fds(sock, [struct.pack("!I", len(request))], fds)
        sock.sendall(request)
        reply = sock.makefile("r")
        started = reply.readline()
    except OSError as e:
        sock.close()
        plain(str(e))
        return
    if not started.startswith("pid "):  # the server ended before forking (e.g. it failed while importing)
        sock.close()
        plain("it closed the connection")
        return
    for fd in fds:  # the child holds them now; this process keeps none of the proc's pipes open
        if fd > 2:
            os.close(fd)
    status = reply.readline().strip()
    # no status: the server died, and with it the child (its parent-death signal), so this proc is gone too
    relay(status or f"signal {int(signal.SIGKILL)}")


if __name__ == "__main__":
    main()
