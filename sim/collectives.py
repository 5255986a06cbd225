"""The TCP baselines as SimGrid actors: gloo's ring all-reduce and the parameter server.

Ring (`ring` over every rank, `hier-ring` over the hosts' leaders): N ranks, 2(N-1) steps, in
each of which every rank sends 1/N of the tensor to the next rank and receives from the one
before, then waits for the step's message overhead (Costs.step_s: gloo's per-message work and
round trip, which a flow model does not see). Ranks are numbered host-major, as
torch.distributed numbers them, so a host's G ranks form G-1 edges on its bus and one edge over
its link to the next host. One actor per host runs its ranks' edges. On large rings the steps
are grouped: at most `max_steps` rounds, each moving the bytes of the steps it stands for and
paying their overheads (every step of a ring moves the same bytes over the same edges, so the
links see the same load).

Parameter server (`ps`, passing_agent.strategies): a server on the first host's leader; every
other rank pushes its tensor in chunks and pulls the sums, at most PS_WINDOW chunks ahead of the
sums it has back; the server sums chunk c once every push of c is in and sends it back on each
worker's connection (one actor each), in order. A host's ranks are one worker here (one
connection carrying their G pushes), which loads the links as G connections do. Tensors of more
than `max_chunks` chunks are pushed in larger chunks (sim.stream.ramp: one real chunk first,
doubling up to 1/max_chunks of the tensor), PS_WINDOW of them in flight.
"""

from __future__ import annotations

import math
from collections import Counter

from sim import wire
from sim.context import SimContext
from sim.stream import ramp

# passing_agent.strategies' values (that module imports torch; tests/sim checks they agree).
PS_CHUNKS = 16
PS_CHUNK_MIN_BYTES = 4 << 10
PS_CHUNK_MAX_BYTES = 256 << 10
PS_WINDOW = 4
ACKS_PER_FRAME = 0.5  # one ACK frame per two segments (bench.analytic), for the kernel's CPU


def ps_chunk_bytes(nbytes: int) -> int:
    return max(PS_CHUNK_MIN_BYTES, min(PS_CHUNK_MAX_BYTES, -(-nbytes // PS_CHUNKS)))


def tcp_transfer_cpu(ctx: SimContext, src: str, dst: str, payload: float) -> float:
    """The emulation's CPU for a TCP transfer between two hosts: every frame and its ACKs
    through the kernel on every link, and through every switch process on the way."""
    frames = wire.tcp_frames(payload) * (1 + ACKS_PER_FRAME)
    hops = ctx.platform.hops(src, dst)
    return ctx.frames_cpu(frames, hops) + ctx.forward_cpu(frames, hops)


class Ring:
    """A ring all-reduce over `hosts` with `ranks` ranks on each."""

    def __init__(self, ctx: SimContext, job: int, hosts: list[str], ranks: int, nbytes: int,
                 max_steps: int):
        self.ctx, self.job, self.hosts, self.ranks = ctx, job, hosts, ranks
        n = len(hosts) * ranks
        self.steps = 2 * (n - 1)
        self.rounds = max(1, min(self.steps, max_steps))
        self.step_bytes = nbytes / n

    def steps_in(self, r: int) -> int:
        """Ring steps round r stands for (they add up to 2(N-1))."""
        return self.steps * (r + 1) // self.rounds - self.steps * r // self.rounds

    def run_host(self, index: int) -> None:
        ctx, host = self.ctx, self.hosts[index]
        nxt = self.hosts[(index + 1) % len(self.hosts)]
        inbox = ctx.listen(f"job{self.job}/ring/{host}") if len(self.hosts) > 1 else None
        for r in range(self.rounds if self.steps else 0):
            k = self.steps_in(r)
            payload = k * self.step_bytes
            # The host's edges between its own ranks, on its bus (one transfer of their bytes).
            local_edges = self.ranks - 1 if inbox is not None else self.ranks
            acts = [ctx.bus_async(host, local_edges * payload)] if local_edges else []
            if inbox is not None:
                acts.append(ctx.put_async(f"job{self.job}/ring/{nxt}", r,
                                          wire.tcp_wire_bytes(payload)))
                acts.append(ctx.cpu_start(host, tcp_transfer_cpu(ctx, host, nxt, payload)))
                ctx.receive(inbox)
            ctx.wait_all(acts)
            ctx.sleep(k * ctx.costs.step_s)


class ParameterServer:
    """The `ps` baseline over `hosts` (server: the first host's leader), `ranks` per host."""

    def __init__(self, ctx: SimContext, job: int, hosts: list[str], ranks: int, nbytes: int,
                 max_chunks: int):
        self.ctx, self.job, self.hosts, self.ranks = ctx, job, hosts, ranks
        n_real = max(1, math.ceil(nbytes / ps_chunk_bytes(nbytes)))
        pieces = (1,) * n_real if n_real <= max_chunks else ramp(n_real, max_chunks)
        self.chunk_bytes = [p * nbytes / n_real for p in pieces]
        self.chunks = len(pieces)
        self.window = PS_WINDOW
        self.server = hosts[0]
        # A worker per host: its ranks, less the server's own rank on the first host.
        self.workers = {h: ranks - (1 if h == self.server else 0) for h in hosts}
        self.workers = {h: n for h, n in self.workers.items() if n > 0}
        # The server's state: pushes in per chunk, and a permit per summed chunk for each
        # worker's connection. (The workers count their own pushes when the transfer ends: a
        # server actor waiting on a thousand connections would cost a scan of them each.)
        self._count: Counter[int] = Counter()
        self._ready = 0
        self._sums = {w: ctx.sg.Semaphore(0) for w in self.workers}

    def _box(self, what: str) -> str:
        return f"job{self.job}/ps/{what}"

    def _payload(self, src: str, dst: str, ranks: int, c: int) -> tuple[float, float]:
        """(bytes on the wire, CPU) for chunk c of `ranks` ranks from src to dst."""
        raw = ranks * self.chunk_bytes[c]
        if src == dst:  # loopback, over the bus
            return raw, 0.0
        return wire.tcp_wire_bytes(raw), tcp_transfer_cpu(self.ctx, src, dst, raw)

    def run_worker(self, host: str) -> None:
        ctx, n = self.ctx, self.workers[host]
        inbox = ctx.listen(self._box(host))
        pulled = 0
        for c in range(self.chunks):
            while c - pulled >= self.window:
                ctx.receive(inbox)
                pulled += 1
            nbytes, cpu = self._payload(host, self.server, n, c)
            ctx.transfer(host, host, self.server, nbytes, cpu)
            self._pushed(c)
            ctx.sleep(ctx.costs.step_s)
        while pulled < self.chunks:
            ctx.receive(inbox)
            pulled += 1

    def _pushed(self, c: int) -> None:
        """A worker's push of chunk c is in: the server sums chunks in order, each once every
        worker's push of it is in, and hands the sum to every worker's connection."""
        self._count[c] += 1
        while self._ready < self.chunks and self._count[self._ready] == len(self.workers):
            for sem in self._sums.values():
                sem.release()
            self._ready += 1

    def run_puller(self, host: str) -> None:
        """The server's connection to one worker: its sums, in chunk order."""
        ctx = self.ctx
        for c in range(self.chunks):
            self._sums[host].acquire()
            nbytes, cpu = self._payload(self.server, host, self.workers[host], c)
            ctx.send(self.server, self._box(host), c, nbytes, cpu)
        ctx.timings.done(self.job, self.server, 0, ctx.clock)
