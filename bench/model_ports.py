"""Frames per second through the software switch's ports alone: batched (recvmmsg, one
sendmmsg per egress port and batch) against one system call per frame, alternating.

A veth pair per port; the frames are queued on port 1 before the ports start, then a pipeline
that does nothing but send each frame out of port 2 takes them; the time until the last is
taken is the ports' own cost (the kernel's delivery to the far end included), without the
sender competing for the cores. Needs root.

    python -m bench.model_ports [--frames 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

from passing import mmsg
from passing import protocol as P
from switch_model.ports import Ports
from testbed.veth_ports import TestPort, delete_link, make_veth

SO_RCVBUFFORCE = 33


class _Forward:
    """Every frame out of port 2, counted."""

    def __init__(self):
        self.n = 0

    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        self.n += 1
        return [(2, frame)]


def one_run(interfaces: dict[int, str], sender: TestPort, sink: TestPort, frames: int,
            batched: bool) -> tuple[float, int]:
    """Frames per second the ports pass with `frames` queued on port 1, and how many they
    passed."""
    ports = Ports(interfaces)
    ports._batched = batched
    for sock in ports.socks.values():  # room for every queued frame (root may exceed rmem_max)
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    frame = b"\x02" * 6 + b"\x04" * 6 + b"\x88\xb5" + bytes(P.FRAME_BYTES - 14)
    for _ in range(frames):
        sender.send(frame)
    pipe, stop = _Forward(), threading.Event()
    th = threading.Thread(target=ports.run, args=(pipe, stop), daemon=True)
    t0 = time.perf_counter()
    th.start()
    last, moved = 0, time.perf_counter()
    while pipe.n < frames and time.perf_counter() - moved < 2:
        time.sleep(0.001)
        if pipe.n != last:  # a frame the kernel dropped on the way in never comes
            last, moved = pipe.n, time.perf_counter()
    dt = (time.perf_counter() if pipe.n >= frames else moved) - t0
    stop.set()
    th.join(5)
    ports.close()
    sink.drain()
    return pipe.n / dt, pipe.n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=10000,
                    help="frames queued per run (at most what a socket buffer holds)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.model_ports: veth interfaces need root", file=sys.stderr)
        return 2
    if not mmsg.available():
        print("bench.model_ports: no recvmmsg/sendmmsg here: nothing to compare",
              file=sys.stderr)
        return 2
    tag = f"pb{os.getpid() % 10000:04d}"
    made: list[str] = []
    try:
        for p in (1, 2):
            make_veth(f"{tag}s{p}", f"{tag}t{p}")
            made.append(f"{tag}s{p}")
        sender, sink = TestPort(f"{tag}t1"), TestPort(f"{tag}t2")
        res: dict[str, list[float]] = {"per_frame": [], "batched": []}
        passed: dict[str, list[int]] = {"per_frame": [], "batched": []}
        for _ in range(args.rounds):
            for mode in res:
                rate, n = one_run({1: f"{tag}s1", 2: f"{tag}s2"}, sender, sink, args.frames,
                                  mode == "batched")
                res[mode].append(round(rate))
                passed[mode].append(n)
        sender.close()
        sink.close()
    finally:
        for name in made:
            delete_link(name)
    if args.json:
        print(json.dumps({"frame_bytes": P.FRAME_BYTES, "frames": args.frames, "passed": passed,
                          **res}))
    else:
        print(f"model ports, {P.FRAME_BYTES}-byte frames, frames/s: one call per frame "
              f"{res['per_frame']}, batched {res['batched']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
