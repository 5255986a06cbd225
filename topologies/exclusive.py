"""One PASSING network per machine at a time.

Two Mininet networks of PASSING would break each other without a word: they share the
management bridge's name (`passing-mgmt`, which a start removes as a crashed run's
leftover), the switches' gRPC ports and the Mininet interface names. So a network holds an
exclusive lock on a file for its whole life, and a second start is refused with who holds it.

The lock is flock(2) on an open file: the kernel drops it when the holder exits, however it
exits (a crash, `make stop`, a kill), so a stale lock never blocks a later start. The file
names the holder (PID and command line) for the refusal's message; what it says is only read
when the lock is taken, never trusted to decide.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_ENV = "PASSING_NETWORK_LOCK"  # another lock file (tests)
LOCK_FILE = Path("/run/passing-network.lock")


class NetworkBusy(RuntimeError):
    """Another PASSING network runs on this machine."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "unknown process"
    pid, _, cmd = text.partition(" ")
    return f"pid {pid}: {cmd}" if pid.isdigit() else "unknown process"


class NetworkLock:
    """Held from acquire() to release() (idempotent); `path` defaults to $PASSING_NETWORK_LOCK,
    else LOCK_FILE."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path or os.environ.get(LOCK_ENV) or LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise NetworkBusy naming the network that holds it."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise NetworkBusy(
                f"another PASSING network is running on this machine ({_holder(self.path)}); "
                "two at once would share the management bridge and the switches' gRPC ports "
                "and break each other. Stop it first (quit its Mininet CLI, or `make stop`)."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {_command_line()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            os.close(fd)  # closing the only descriptor drops the lock

    @property
    def held(self) -> bool:
        return self._fd is not None


def _command_line() -> str:
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p)[:200]


def busy_message() -> str | None:
    """Why a network cannot start now (another holds the machine), or None: for commands that
    would spend minutes (calibrating, building) before their first network starts. Taking and
    dropping the lock at once: the network's own start takes it again, and is refused then
    if another got in between."""
    lock = NetworkLock()
    try:
        lock.acquire()
    except NetworkBusy as e:
        return str(e)
    lock.release()
    return None
