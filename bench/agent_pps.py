"""Packets per second one host agent can stream, against a local sink that answers every
contribution at once with a result (as a switch with fan-in 1 would).

    python -m bench.agent_pps [--size 4M] [--slots 256] [--sink udp|memory]

`memory`: the agent's own cost (fixed point, packing, matching, window) without syscalls, each
launch and each batch of results handed over whole.
`udp`: the same over real UDP on 127.0.0.1, the echo in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import select
import socket
import sys
import time

import numpy as np

from host_agent.session import new_session
from host_agent.stream import SlotStreamer, StreamConfig
from host_agent.transport import RECEIVE_SLOT, UdpTransport
from passing import mmsg, packet
from passing import protocol as P
from passing_agent.sizes import parse_size


def as_result(payload: bytes) -> bytes:
    return packet.with_flags(payload, int(P.Flag.RESULT))


class MemorySink:
    """Answers in memory. `per_pass` > 0 hands the agent at most that many results per
    receive, as a busy machine does (its scheduler wakes the agent for a few results at a
    time): what the agent's fixed cost per pass of its loop weighs."""

    def __init__(self, per_pass: int = 0):
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.per_pass = per_pass
        self.held = np.zeros((0, P.PAYLOAD_BYTES), dtype=np.uint8)

    def send(self, payload: bytes) -> None:
        self.q.put(as_result(payload))

    def recv(self, timeout: float) -> list[bytes]:
        out = []
        try:
            out.append(self.q.get(timeout=timeout))
            while True:
                out.append(self.q.get_nowait())
        except queue.Empty:
            return out

    # A batch in, a batch out: what the agent costs when its I/O is batched.
    def send_rows(self, rows: np.ndarray) -> None:
        rows = rows.copy()
        rows[:, packet.FLAGS_OFFSET] = int(P.Flag.RESULT)
        self.q.put(rows)

    def recv_rows(self, timeout: float) -> tuple[np.ndarray, int]:
        if not self.per_pass or len(self.held) < self.per_pass:
            got = self.recv(0.0 if len(self.held) else timeout)
            self.held = np.concatenate([self.held] + [
                g if isinstance(g, np.ndarray) else np.frombuffer(g, np.uint8).reshape(1, -1)
                for g in got])
        n = self.per_pass or len(self.held)
        out, self.held = self.held[:n], self.held[n:]
        return out, 0


def _echo(port_out, stop, batched: bool) -> None:
    """Answer every datagram with itself as a RESULT; batched, many per system call (the
    echo must not be slower than the agent it measures)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    port_out.put(sock.getsockname()[1])
    receiver = mmsg.Receiver(slot=RECEIVE_SLOT) if batched else None
    while not stop.is_set():
        try:
            payload, addr = sock.recvfrom(65535)
        except TimeoutError:
            continue
        sock.sendto(as_result(payload), addr)
        if receiver is None:
            continue
        sock.connect(addr)  # one agent: from here on, batches to it
        while not stop.is_set():
            if not select.select([sock], [], [], 0.2)[0]:
                continue
            buf, lengths = receiver.receive(sock)
            rows = buf[lengths == P.PAYLOAD_BYTES, :P.PAYLOAD_BYTES].copy()
            rows[:, packet.FLAGS_OFFSET] = int(P.Flag.RESULT)
            mmsg.send_rows(sock, rows)


def udp_echo(batched: bool) -> tuple[int, mp.Process, object]:
    """An echo in its own process (a thread would share the agent's interpreter lock)."""
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_echo, args=(port_q, stop, batched), daemon=True)
    proc.start()
    return port_q.get(timeout=30), proc, stop


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("1M"))
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--sink", choices=["memory", "udp"], default="memory")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calls", type=int, default=3,
                    help="timed calls after a warm-up call; the median is reported (default 3)")
    ap.add_argument("--per-packet", action="store_true",
                    help="one system call per datagram (the agent and the echo), as before "
                         "batched I/O, for comparison")
    ap.add_argument("--per-pass", type=int, default=0, metavar="N",
                    help="memory sink: at most N results per receive (default 0: all there); "
                         "the agent's gathering is off then")
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error("--calls: at least 1")
    if args.per_pass < 0 or (args.per_pass and args.sink != "memory"):
        ap.error("--per-pass: a number of results, with --sink memory")
    echo, batched = None, False
    if args.sink == "udp":
        batched = mmsg.available() and not args.per_packet
        port, echo, stop = udp_echo(batched)
        transport = UdpTransport("127.0.0.1", 0, "127.0.0.1", port, batched=batched)
    else:
        transport, batched = MemorySink(args.per_pass), True
    # --per-pass holds results back that are already there: the agent's gathering (which waits
    # for results still on their way) would only wait, so it is off; this measures the loop.
    off = {"gather_max": 0.0} if args.per_pass else {}
    streamer = SlotStreamer(StreamConfig(1, 0, args.slots, 1, new_session(), rto=1.0, **off),
                            transport)
    rng = np.random.default_rng(0)
    times, cpu, pkts = [], [], 0
    try:
        # A warm-up call, then the timed ones: an agent makes call after call, and the first
        # pays for memory the later ones find mapped. Every result is checked.
        for call in range(args.calls + 1):
            x = rng.standard_normal(args.size).astype(np.float32)
            before = streamer.stats.packets
            t0, c0 = time.perf_counter(), time.process_time()
            y = streamer.allreduce(x)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if not np.allclose(y, x, rtol=0, atol=1e-5 * float(np.max(np.abs(x)))):
                raise SystemExit(f"call {call}: wrong result")
            if call:
                times.append(dt)
                cpu.append(dc)
                pkts = streamer.stats.packets - before
    finally:
        if echo is not None:
            stop.set()
            echo.join(5)
    dt = float(np.median(times))
    # The agent's own CPU time (this process: the echo runs in another): below the call's
    # time, the agent waited for the echo or the kernel, and could stream faster than `pps`.
    busy = float(np.median(np.array(cpu) / np.array(times)))
    res = {"sink": args.sink, "batched": batched, "per_pass": args.per_pass,
           "values": args.size, "packets": pkts, "calls": args.calls,
           "seconds": round(dt, 3),
           "pps": round(pkts / dt), "value_gbps": round(args.size * 32 / dt / 1e9, 3),
           "agent_cpu": round(busy, 2)}
    print(json.dumps(res) if args.json else
          f"agent -> {args.sink} sink: {res['pps']} packets/s ({pkts} packets a call, median "
          f"of {args.calls} after a warm-up, agent CPU {busy:.0%} of the time, "
          f"{res['value_gbps']} Gbit/s of float32 values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
