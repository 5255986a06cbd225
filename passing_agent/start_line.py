"""The start line of each timed call: every rank of every host waits there until all have
come, then all start their timers together.

It was a meeting on the session's TCP store (and, for the baselines, gloo's barrier). Under
frame loss that meeting was itself the slowest part of a "call": a lost segment of the store's
traffic costs TCP's 200 ms retransmission timeout, and the hosts that passed the meeting
started their timers up to 1.5 s before the one still in it (leafspine, 20% loss on one host
link, 2026-12-04), time that every strategy's loss figures then held and that no all-reduce
spends. Here each rank says "arrived" over UDP to every other rank, in three copies across the
fabric, asking for an answer only of the ranks it has not heard from yet; it asks again after
5 ms, then at doubling intervals, while some rank is missing, and a thread answers a rank that
asks, even after this one has left: a lost datagram costs milliseconds, not a TCP timeout.

    line = StartLine((my_ip, 0))                   # listens on a port of its own
    # ... every rank's line.address exchanged (the worker does it over its process groups)
    line.connect(my_rank, addresses, token)        # addresses: (ip, port) of every rank
    line.meet(call, timeout)                       # returns when every rank has reached `call`
    line.close()

Datagrams carry the run's token: a late one from an earlier run, or one from anyone else, is
ignored. The worst a forged one can do is start a timer early, never change a sum."""

from __future__ import annotations

import socket
import struct
import threading
import time

_MAGIC = 0x5354  # "ST"
_FORMAT = "!HBHIQ"  # magic, kind, sender rank, call, token
_ASK, _ACK = 1, 2  # "I am here, are you?" (answered while the answerer has come) / "I am here"
_SIZE = struct.calcsize(_FORMAT)
# Copies sent on arrival to a rank on another host: at 5% loss on four links each is lost 19%
# of the time, all three 0.7%. One to a rank on the same host (no link between them).
_COPIES = 3
# Asking again is only for copies that were all lost (a rank that has not come yet will send
# its own): after 5 ms, then every 10, 20, 40 ms. The datagrams cross the links and switches
# the calls use: at 1 ms, doubling to 5, the ranks waiting on a late one sent 100-170 per call
# each (25-45% more bytes on a host link than a 64 KiB call's own).
_RESEND_FIRST_S = 0.005
_RESEND_MOST_S = 0.040


class StartLine:
    """One rank's end of the start line. It listens on `bind` ((ip, 0): a port the kernel
    picks, so that two jobs on one host never ask for the same one) from the start and
    ignores every datagram until `connect` tells it the run's ranks and token."""

    def __init__(self, bind: tuple[str, int]):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.bind(bind)
        except OSError as e:
            self._sock.close()
            raise OSError(f"start line: cannot listen on {bind[0]}:{bind[1]} ({e.strerror})"
                          ) from None
        self.address: tuple[str, int] = self._sock.getsockname()
        self.rank = -1
        self.addresses: list[tuple[str, int]] = []
        self.names: list[str] = []
        self.token: int | None = None  # None: not connected, every datagram ignored
        self._lock = threading.Condition()
        # Per call, the ranks heard from (this one's own arrival included).
        self._heard: dict[int, set[int]] = {}
        self._reached = -1  # the latest call this rank has come to
        self._answered: dict[tuple[int, int], float] = {}  # (rank, call): when last answered
        self._closed = False
        self.sent = 0  # datagrams this rank sent (they cross the links the calls use)
        self._reader = threading.Thread(target=self._read, name="start-line", daemon=True)
        self._reader.start()

    def connect(self, rank: int, addresses: list[tuple[str, int]], token: int,
                names: list[str] | None = None) -> None:
        """This line is rank `rank` of `addresses` (every rank's `address`, this one's at
        `rank`); `token` is the run's, the same on every rank; `names`: what an error calls
        each rank (default "rank N"). A rank that meets before another has connected costs it
        nothing: what that one ignored, it asks for again when it meets."""
        if not 0 <= rank < len(addresses) or tuple(addresses[rank]) != tuple(self.address):
            raise ValueError(f"rank {rank} of {len(addresses)} ranks: not this line's "
                             f"address {self.address}")
        with self._lock:
            self.rank, self.addresses = rank, [tuple(a) for a in addresses]
            self.names = names or [f"rank {r}" for r in range(len(addresses))]
            self.token = token & (2**64 - 1)

    def meet(self, call: int, timeout: float) -> None:
        """Return once every rank has come to `call` (calls count up from 0, the same on every
        rank); HostsMissing after `timeout` seconds without them."""
        if self.token is None:
            raise RuntimeError("start line: meet before connect")
        with self._lock:
            self._reached = max(self._reached, call)
            heard = self._heard.setdefault(call, set())
            heard.add(self.rank)
            # A rank already heard from only needs to hear this one: no answer asked of it.
            known = set(heard)
        here = self.addresses[self.rank][0]
        for kind, ranks in ((_ACK, [r for r in self._others() if r in known]),
                            (_ASK, [r for r in self._others() if r not in known])):
            self._tell(kind, call, ranks)
            for _ in range(_COPIES - 1):
                self._tell(kind, call, [r for r in ranks if self.addresses[r][0] != here])
        deadline = time.monotonic() + timeout
        resend = _RESEND_FIRST_S
        with self._lock:
            while True:
                missing = self._missing(call)
                if not missing:
                    break
                now = time.monotonic()
                if now >= deadline:
                    raise HostsMissing(
                        f"{len(missing)} of {len(self.addresses)} ranks ("
                        f"{', '.join(self.names[r] for r in sorted(missing))}) did not come to "
                        f"call {call} within {timeout:g} s:"
                        " their agents stopped or were restarted (a restarted agent cannot "
                        "rejoin a running job's session); start every host's agent again")
                self._lock.wait(min(resend, deadline - now))
                missing = self._missing(call)
                if missing:
                    self._lock.release()
                    try:
                        self._tell(_ASK, call, missing)
                    finally:
                        self._lock.acquire()
                    resend = min(resend * 2, _RESEND_MOST_S)
            # Earlier calls' sets are no longer needed (a late copy re-adds nothing: _read
            # keeps only calls not yet passed).
            for old in [c for c in self._heard if c < call]:
                del self._heard[old]
            for key in [k for k in self._answered if k[1] < call - 1]:
                del self._answered[key]

    def close(self) -> None:
        with self._lock:
            self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(1.0)

    def _others(self) -> list[int]:
        return [r for r in range(len(self.addresses)) if r != self.rank]

    def _missing(self, call: int) -> set[int]:
        return set(range(len(self.addresses))) - self._heard.get(call, set())

    def _tell(self, kind: int, call: int, ranks) -> None:
        data = struct.pack(_FORMAT, _MAGIC, kind, self.rank, call, self.token)
        sent = 0
        for r in ranks:
            try:
                self._sock.sendto(data, self.addresses[r])
                sent += 1
            except OSError:
                pass  # (an unreachable peer is the timeout's to report)
        with self._lock:  # (the reader thread sends too)
            self.sent += sent

    def _read(self) -> None:
        while True:
            try:
                data, _ = self._sock.recvfrom(64)
            except OSError:
                return  # closed
            if len(data) != _SIZE:
                continue
            magic, kind, sender, call, token = struct.unpack(_FORMAT, data)
            with self._lock:
                if self._closed:
                    return
                if magic != _MAGIC or kind not in (_ASK, _ACK) or token != self.token \
                        or not 0 <= sender < len(self.addresses) or sender == self.rank:
                    continue
                # A rank asks until it has heard from this one: answer for any call this one
                # has come to (it may have left it already). Never an answer: two ranks
                # would answer each other for ever.
                answer = kind == _ASK and call <= self._reached
                if answer:  # once per copy burst, not once per copy
                    now = time.monotonic()
                    answer = now - self._answered.get((sender, call), -1.0) >= _RESEND_FIRST_S / 2
                    if answer:
                        self._answered[sender, call] = now
                if call > self._reached or call in self._heard:
                    self._heard.setdefault(call, set()).add(sender)
                    self._lock.notify_all()
            if answer:
                self._tell(_ACK, call, [sender])


class HostsMissing(RuntimeError):
    """Some rank never reached the start line: the job cannot go on without it."""
