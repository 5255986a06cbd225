"""The local ranks' channel: one unix seqpacket connection between the leader and each other
local rank, made once, next to the shared file of host_agent.local_stage, for what two gloo
collectives carried on every call: each rank's "my tensor is in its region" (with its call's
size, dtype and mapping), and the leader's status after the stream.

Why not gloo: each collective hands the call to gloo's worker thread, which moves a few bytes
through loopback TCP and wakes the caller again; on the 2-core benchmark machine with eight
ranks a reduce-and-broadcast pair of a few integers took about 850 us per call against 15 us
for a round trip on a unix socket, and training a small model makes one call per step.

Messages keep their boundaries and order (SOCK_SEQPACKET); each carries its kind and its
number on that connection in that direction, so a receiver that is not where the sender is
(an interrupted call) finds out at the next message instead of reading the wrong one. A
connection ends when its process does: the other side's next read says so at once, as a
broken TCP connection does for gloo. A rank that stays silent is given up after
`timeout` (the group's own timeout, as gloo's collectives wait: group_timeout).

Who may connect: the listening socket is a file beside the shared file, so only processes of
the same machine (and mount) reach it; the leader takes a connection only from a process of
its own user (SO_PEERCRED) that names a local rank and that rank's token of the mapping just
agreed over the group (which only the ranks of the group have seen), once per rank; anything
else is closed unread.
"""

from __future__ import annotations

import os
import socket
import struct
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

READY, VERDICT, STATUS, COUNT, HELLO, WELCOME = range(1, 7)
_HEAD = struct.Struct("<BI")  # kind, the message's number on its connection and direction
_HELLO = struct.Struct("<IQ")  # local rank, its token of the mapping just agreed
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MAX = 4096


def group_timeout(group: dist.ProcessGroup | None) -> float:
    """Seconds a rank waits for another before giving up: the group's own timeout (as gloo
    waits in its collectives), else the process groups' default."""
    try:
        limit = group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError, TypeError):
        limit = getattr(dist, "default_pg_timeout", None)
    return limit.total_seconds() if isinstance(limit, timedelta) else 1800.0


class ChannelBroken(RuntimeError):
    """The other end of a local rank's connection is gone, silent too long, or out of step."""


class Link:
    """One connection: the leader holds one per other local rank, each other rank one."""

    def __init__(self, sock: socket.socket, peer: int, timeout: float):
        self.sock, self.peer, self.timeout = sock, peer, timeout
        self.sent = self.received = 0
        sock.settimeout(timeout)

    def send(self, kind: int, payload: bytes = b"") -> None:
        try:
            self.sock.send(_HEAD.pack(kind, self.sent & 0xFFFFFFFF) + payload)
        except OSError as e:
            raise ChannelBroken(f"local rank {self.peer} cannot be told ({e}): did it exit?") \
                from None
        self.sent += 1

    def recv(self, *kinds: int) -> tuple[int, bytes]:
        """The next message, which must be of one of `kinds`: (kind, payload)."""
        try:
            data = self.sock.recv(_MAX)
        except TimeoutError:
            raise ChannelBroken(f"local rank {self.peer} said nothing for "
                                f"{self.timeout:.0f} s") from None
        except OSError as e:
            raise ChannelBroken(f"local rank {self.peer} is gone ({e})") from None
        if not data:
            raise ChannelBroken(f"local rank {self.peer} closed its end: did it exit?")
        if len(data) < _HEAD.size:
            raise ChannelBroken(f"local rank {self.peer} sent a runt message")
        kind, number = _HEAD.unpack_from(data)
        if number != self.received & 0xFFFFFFFF or kind not in kinds:
            raise ChannelBroken(
                f"local rank {self.peer} is out of step (message {number} of kind {kind}, "
                f"expected {self.received} of {kinds}): was a call interrupted?")
        self.received += 1
        return kind, data[_HEAD.size:]

    def leftover(self) -> tuple[int, bytes] | None:
        """A message waiting unread, if any (kind, payload), whatever its number: what a
        leader that has gone said last, e.g. why."""
        try:
            self.sock.setblocking(False)  # (with a timeout set, Python would wait for one)
            data = self.sock.recv(_MAX)
        except OSError:
            return None
        if len(data) < _HEAD.size:
            return None
        return _HEAD.unpack_from(data)[0], data[_HEAD.size:]

    def close(self) -> None:
        """Closed once whatever was sent here is read: closing a unix socket with messages
        unread resets the other end, whose next read would then fail before it reaches
        what was last sent to it (e.g. why this end is closing)."""
        try:
            self.sock.setblocking(False)
            while self.sock.recv(_MAX):
                pass
        except OSError:
            pass
        self.sock.close()


def listen(path: Path, backlog: int) -> socket.socket | None:
    """The leader's listening socket at `path` (None if it cannot be made there: the ranks
    then keep gloo's collectives). An existing file of that name is never replaced."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(str(path))
    except OSError:  # too long a name, no such directory, or the name is taken
        sock.close()
        return None
    try:
        os.chmod(path, 0o600)
        sock.listen(backlog)
    except OSError:
        sock.close()
        path.unlink(missing_ok=True)
        return None
    return sock


def connect(path: Path, rank: int, token: int, timeout: float) -> Link | None:
    """A non-leader rank's connection to the leader, its hello sent (None if it failed)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
        link = Link(sock, 0, timeout)
        link.send(HELLO, _HELLO.pack(rank, token))
    except (OSError, ChannelBroken):
        sock.close()
        return None
    return link


def accept_all(listener: socket.socket, path: Path, tokens: list[int],
               timeout: float) -> dict[int, Link] | None:
    """The leader, once every other rank has connected and said hello (the caller knows from a
    collective that each did): one link per rank 1..n-1, each told so (WELCOME 1); or None
    and every rank told it is not (WELCOME 0, or its pending connection reset). The listener
    and its file are gone afterwards."""
    links: dict[int, Link] = {}
    try:
        listener.setblocking(False)
        while len(links) < len(tokens) - 1:
            # (none left, or no descriptor for one: not every rank's, so nobody's)
            sock, _ = listener.accept()
            rank = _check_hello(sock, tokens, links)
            if rank is None:
                sock.close()
                continue
            try:
                links[rank] = link = Link(sock, rank, timeout)
            except OSError:
                sock.close()
                raise
            link.received = 1  # the hello
    except OSError:
        pass
    finally:
        listener.close()  # connections still pending are reset
        path.unlink(missing_ok=True)
    complete = len(links) == len(tokens) - 1
    for link in links.values():
        try:
            link.send(WELCOME, bytes([complete]))
        except ChannelBroken:
            complete = False
    if not complete:
        for link in links.values():
            link.close()
        return None
    return links


def _check_hello(sock: socket.socket, tokens: list[int], taken: dict[int, Link]) -> int | None:
    """The rank a new connection speaks for, if it is one of the group's (else None)."""
    try:
        cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        if _CRED.unpack(cred)[1] != os.getuid():
            return None
        sock.setblocking(False)
        data = sock.recv(_MAX)  # the hello was sent before the collective: it is there
    except OSError:
        return None
    if len(data) != _HEAD.size + _HELLO.size or _HEAD.unpack_from(data) != (HELLO, 0):
        return None
    rank, token = _HELLO.unpack_from(data, _HEAD.size)
    if not 0 < rank < len(tokens) or rank in taken or token != tokens[rank] or not token:
        return None
    return rank


def welcomed(link: Link) -> bool:
    """A non-leader rank: whether the leader took every rank's connection (all use it)."""
    try:
        _, payload = link.recv(WELCOME)
    except ChannelBroken:
        return False
    return payload == b"\x01"
