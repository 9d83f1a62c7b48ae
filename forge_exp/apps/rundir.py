"""One owner per run dir. The controller holds an exclusive lock on `<run dir>/.forge_run.lock` (and on
`<checkpoint.dir>/.forge_run.lock` when that lies elsewhere) for its whole life: a POSIX record lock (lockf), which
the kernel drops when the process ends however it ends (SIGKILL, OOM, a lost node's NFS lease), and which no
forked process inherits (the fork server, the service processes). A second `forge-exp` in the same dir, fresh or
`resume=true`, is refused in one line naming the owner's pid while the owner lives, and may take over once it is
dead: nothing one run writes is overwritten or pruned by another.

    own_dirs(config, run_dir)    the run's directories made absolute and claimed
    claim(directory, key)        lock it for this process (idempotent); ConfigError naming the owner when it is busy
    writable_dir(path, key)      a directory this process can write in (made if need be), or ConfigError
    claim_given(args)            main(): an explicit hydra.run.dir, claimed before Hydra writes .hydra/ into it
    held()                       the descriptors of the locks held (the fork server's child closes them)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from forge_exp.config.validate import ConfigError

LOCK_FILE = ".forge_run.lock"
_HELD: dict[str, int] = {}  # real path of a claimed dir -> its lock's descriptor, open until this process ends


def own_dirs(config, run_dir: str) -> None:
    """Make output_dir (default: Hydra's run dir) and checkpoint.dir absolute, the service processes and a resumed
    run (maybe from another cwd) reading the same paths, and claim both for this process."""
    key = "output_dir" if config.output_dir else "hydra.run.dir"
    config.output_dir = os.path.abspath(config.output_dir or run_dir)
    config.checkpoint.dir = os.path.abspath(config.checkpoint.dir or os.path.join(config.output_dir, "checkpoints"))
    claim(config.output_dir, key)
    if os.path.commonpath([config.output_dir, config.checkpoint.dir]) != config.output_dir:
        claim(config.checkpoint.dir, "checkpoint.dir")


def writable_dir(path: str, key: str) -> None:
    """`path` is a directory this process can write files in, made if need be; else one line naming `key`."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key}={path} is a file, not a directory: give a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        where = f": {e.filename}" if e.filename and not str(e.filename).startswith(str(path)) else ""  # a parent
        raise ConfigError(f"{key}={path}: cannot write there ({e.strerror or type(e).__name__}{where}); give a "
                          f"directory this user can write") from None


def claim(directory: str, key: str = "hydra.run.dir") -> int:
    """Lock `directory` (made if need be) for this process; returns the lock's descriptor. A raw descriptor, not a
    file object: closing any descriptor of the file would drop a POSIX lock, and no finalizer may do so."""
    real = os.path.realpath(directory)
    if real in _HELD:
        return _HELD[real]
    writable_dir(directory, key)
    try:
        fd = os.open(os.path.join(real, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(f"{key}={directory}: cannot write there ({e.strerror}); give a directory this user can "
                          f"write") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        owner = _read(fd)
        os.close(fd)  # (this process holds no lock on the file: nothing is dropped)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise ConfigError(f"{key}={directory}: cannot lock it ({e.strerror})") from None
        raise ConfigError(f"{key}={directory} is in use by forge-exp pid {owner.get('pid', '?')} on "
                         f"{owner.get('host', '?')} (started {owner.get('started', '?')}); wait for it to end, stop "
                         f"it (kill -TERM {owner.get('pid', '<pid>')}), or give another {key}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv}).encode(), 0)
    _HELD[real] = fd
    return fd


def claim_given(args: list[str]) -> None:
    """For a single run with an explicit `hydra.run.dir=<dir>` on the command line: the lock before Hydra writes
    .hydra/ and its log into the dir (a run refused later would have overwritten the owner's)."""
    if {"-m", "--multirun"} & set(args) or any(a.startswith("-") for a in args):
        return
    given = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")]
    if given and "${" not in given[-1]:  # an interpolation resolves only in Hydra
        claim(given[-1])


def held() -> tuple[int, ...]:
    return tuple(_HELD.values())


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 65536, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
