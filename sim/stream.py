"""A host's PASSING or INA streams through its switch, at the granularity of chunks of slots.

The real agent keeps `window` packets in flight, one per slot, and sends a slot's next packet
when the slot's result comes back. Simulating each 1350-byte packet of a gigabyte on a thousand
hosts is out of reach, so packets travel in chunks: a stream of P packets is cut into chunks,
a chunk is sent as one transfer of its frames, and a stream keeps as many chunks in flight as
its window holds. Chunk i uses the same slots on every host, so a switch completes chunk i when
every member's chunk i is in (sim.switch). With chunks of one packet this is the protocol
packet by packet.

Chunks grow from one packet to the largest size at the start of a stream (`ramp`): switches
forward chunks cut-through except the first, which they store whole (sim.switch), so the
pipeline fills in a packet time per link rather than a chunk time.

A host sends its chunks one after the other (its NIC's queue is first in, first out). With
several streams per host (INA: one per GPU) the queue starts with each rank's first window
(the window's slots, in whole chunks) in the order the ranks started: a slot completes only
when every rank's packet for it is in, so the second rank's first packet waits behind the
first rank's whole window, as in the emulation. What the simulation keeps in flight beyond
the real window is queued chunk by chunk across the ranks, and entries next to each other in
the queue for the same chunk (every rank's chunk i) go as one transfer.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sim import wire
from sim.context import SimContext


def ramp(total: int, max_pieces: int) -> tuple[int, ...]:
    """`total` units in pieces of at most ceil(total / max_pieces): 1, 2, 4, ... up to that
    size, then pieces of that size (the last one what is left)."""
    big = max(1, math.ceil(total / max(1, max_pieces)))
    head: list[int] = []
    size = 1
    while size < big and sum(head) + size <= total:
        head.append(size)
        size *= 2
    rest = total - sum(head)
    return (*head, *[big] * (rest // big), *([rest % big] if rest % big else []))


@dataclass(frozen=True)
class Chunking:
    """How one stream's packets are cut into chunks."""

    sizes: tuple[int, ...]  # packets per chunk
    in_flight: int  # packets per stream in flight, at most (whole chunks, at least one)
    window: int  # the real window: packets a stream has in flight, one per slot

    @property
    def packets(self) -> int:
        return sum(self.sizes)

    @property
    def chunks(self) -> int:
        return len(self.sizes)

    def size(self, i: int) -> int:
        return self.sizes[i]


def chunking(size_bytes: int, window: int, speculating: bool, max_chunks: int,
             hops: int = 4) -> Chunking:
    """Chunks of at most 1/max_chunks of the stream (ramped), with as many packets in flight
    as the window holds, but at least enough to cover a largest chunk's round trip of `hops`
    links.

    Why the floor: a chunk is stored and forwarded whole at every switch, so its round trip is
    `hops` chunk times where a packet's is `hops` packet times. With chunks of more than
    window / (hops + 1) packets the window would bind in the simulation where it does not in
    the network (a window of 256 slots covers the round trip of every fabric simulated
    here), and a 16 MiB call in 128 chunks of 105 packets ran at half its links' rate."""
    packets = wire.stream_packets(size_bytes, window, speculating)
    slots = wire.slots_in_flight(size_bytes, window, speculating)
    sizes = ramp(packets, max_chunks)
    return Chunking(sizes, max(slots, (hops + 2) * max(sizes)), slots)


@dataclass(frozen=True)
class Contribution:
    sender: str  # host or switch
    streams: int  # contributions in this transfer (an INA host's ranks, sent together)
    chunk: int


@dataclass(frozen=True)
class Result:
    chunk: int
    streams: int  # copies in this transfer: one per stream of the receiving host


def inbox(job: int, node: str, sender: str) -> str:
    """Where `node` takes what `sender` sends it for job `job` (one sender per mailbox)."""
    return f"job{job}/{node}/from/{sender}"


class HostStreams:
    """The streams of one host of one job: its leader's (PASSING) or each GPU's (INA)."""

    def __init__(self, ctx: SimContext, job: int, host: str, tor: str, streams: int,
                 plan: Chunking):
        self.ctx, self.job, self.host, self.tor = ctx, job, host, tor
        self.streams, self.plan = streams, plan
        # The NIC's queue of (stream, chunk): each rank's first window, rank after rank.
        self.queue: deque[tuple[int, int]] = deque()
        self.next_chunk = [0] * streams
        self.in_flight = [0] * streams  # packets
        for s in range(streams):  # each rank's first window, rank after rank
            while self._queue_next(s, plan.window):
                pass
        self._fill()
        self.left = streams * plan.chunks

    def _queue_next(self, s: int, limit: int) -> bool:
        """Queue stream s's next chunk if it keeps the stream within `limit` packets in flight
        (any chunk, if none is in flight)."""
        if self.next_chunk[s] >= self.plan.chunks:
            return False
        n = self.plan.size(self.next_chunk[s])
        if self.in_flight[s] and self.in_flight[s] + n > limit:
            return False
        self.queue.append((s, self.next_chunk[s]))
        self.in_flight[s] += n
        self.next_chunk[s] += 1
        return True

    def _fill(self) -> None:
        """Queue what the streams' in-flight allowance has room for, chunk by chunk across
        the streams."""
        more = True
        while more:
            more = False
            for s in range(self.streams):
                more = self._queue_next(s, self.plan.in_flight) or more

    def run(self) -> None:
        """Send every chunk and take every result (call from the host's actor)."""
        results = self.ctx.listen(inbox(self.job, self.host, self.tor))
        to_tor = inbox(self.job, self.tor, self.host)
        pending = self.ctx.expect(results)
        while self.left:
            if self.queue:
                self._send(to_tor)
                # The results that came in meanwhile.
                while self.left and pending.test():
                    self._take(pending.get())
                    pending = self.ctx.expect(results)
            else:
                self._take(pending.get())
                pending = self.ctx.expect(results)

    def _send(self, to_tor: str) -> None:
        _, i = self.queue.popleft()
        streams = 1
        while self.queue and self.queue[0][1] == i:
            self.queue.popleft()
            streams += 1
        n = self.plan.size(i) * streams
        costs = self.ctx.costs
        cpu = n / costs.agent_pps if costs.agent_pps and costs.shared_cpu else 0.0
        cpu += self.ctx.frames_cpu(n, 1)
        self.ctx.send(self.host, to_tor, Contribution(self.host, streams, i),
                      n * wire.FRAME_BYTES, cpu)

    def _take(self, result: Result) -> None:
        for s in range(result.streams):
            self.left -= 1
            self.in_flight[s] -= self.plan.size(result.chunk)
        self._fill()
