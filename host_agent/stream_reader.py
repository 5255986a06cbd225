"""A streamer's reading of its transport: a call's receives, and between calls (in quorum mode) a
thread that keeps reading, so that no socket buffer limits how late a host may be while the
others' results arrive (docs/protocol.md, "Rounds, quorum and late contributions"). A call
holds the socket; the thread reads only while no call does."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from host_agent.stream_api import Transport
from passing import packet

DRAIN_POLL = 0.005  # seconds the reader between calls waits for a datagram at a time


class Reader:
    """Reads `transport`; between calls, while draining, hands what arrives to `keep(rows,
    datagrams of another size)`. `name` names the thread."""

    def __init__(self, transport: Transport, name: str,
                 keep: Callable[[np.ndarray, int], None]):
        self.transport, self.name, self.keep = transport, name, keep
        self._io = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._drain_stop = threading.Event()  # back to waiting for everyone (drain(False))
        self._thread: threading.Thread | None = None

    def receive(self, timeout: float) -> tuple[np.ndarray, int]:
        """Datagrams of the payload size as (n, PAYLOAD_BYTES) rows, and how many others."""
        recv_rows = getattr(self.transport, "recv_rows", None)
        if recv_rows is not None:
            return recv_rows(timeout)
        return packet.rows_of(self.transport.recv(timeout))

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the socket (and what `keep` writes) against the thread, which lets go of `_io`
        once it sees this host is not idle (a lock alone would let it take `_io` back every
        poll)."""
        self._idle.clear()
        try:
            with self._io:
                yield
        finally:
            self._idle.set()

    @property
    def draining(self) -> bool:
        """Whether the thread reads between calls."""
        return self._thread is not None and self._thread.is_alive()

    def drain(self, on: bool) -> None:
        """Read between calls from now on, or no longer (nothing arrives between calls when
        nobody can close a round without this host, and the thread would only compete with
        every call for the socket). Nothing once stopped."""
        if not on and self._thread is not None:
            self._drain_stop.set()
            self._thread.join(5)
            self._thread = None
        elif on and self._thread is None and not self._stop.is_set():
            self._drain_stop.clear()
            self._thread = threading.Thread(target=self._drain, daemon=True, name=self.name)
            self._thread.start()

    def stop(self) -> None:
        """Stop reading between calls, for good."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _drain(self) -> None:
        while not self._stop.is_set() and not self._drain_stop.is_set():
            if not self._idle.wait(0.1):
                continue
            with self._io:
                if self._stop.is_set() or not self._idle.is_set():
                    continue
                try:
                    rows, other = self.receive(DRAIN_POLL)
                except (OSError, ValueError):  # the transport was closed under us
                    return
                self.keep(rows, other)
            time.sleep(0)  # a call waiting for `_io` gets it now
