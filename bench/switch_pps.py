"""Packets per second of a switch target: plain L2 forwarding next to full aggregation packets,
on the same switch process in one run.

The test side keeps a fixed number of packets in flight (sent but not yet come out), so the
switch is always busy but its queues, and the two CPU cores it shares with the sender, are not
flooded; it counts the frames that come out in a fixed time. Plain forwarding: every frame
sent from port 1 to a MAC on port 3 comes out once. Aggregation: hosts on ports 1 and 2 stream
contributions of a fan-in-2 job over a pool of slots, round after round; each completed
slot leaves once per member, so frames out = packets processed. Both use frames of
passing.protocol.FRAME_BYTES (326 bytes at K=64, 1094 at K=256, 1350 at K=320), so
values/s = aggregation packets/s x K compares values per packet (PASSING_K) on one target.

    python -m bench.switch_pps --target bmv2     # needs `make build` and simple_switch_grpc, root
    python -m bench.switch_pps --target model
    PASSING_K=128 python -m bench.switch_pps --target bmv2   # K values per packet

Two rates per kind of frame: `pps`, frames out per second of sending, and `cpu_pps`, frames out
per second of the switch process's own CPU time. The sender is one Python process on the same
two cores: it keeps the C model switch under half busy, so there `pps` is the sender's rate and
`cpu_pps` the switch's; BMv2 is saturated, and its threads may use more than a core.
`capacity_pps`, the larger of the two, is what the switch alone could carry.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller.counters import StatsCounters
from controller.tables.forwarding import ForwardingTables
from passing import protocol as P
from testbed.entries import contribution, host_ip, host_mac, install_job
from testbed.fabric import Fabric

DEV = 0
POOL = 64


def forwarding_frames() -> list[bytes]:
    frame = bytes(Ether(src=host_mac(DEV, 1), dst=host_mac(DEV, 3))
                  / IP(src=host_ip(DEV, 1), dst=host_ip(DEV, 3))
                  / UDP(sport=1234, dport=4321) / (b"\x00" * P.PAYLOAD_BYTES))
    return [frame]


# Where the PASSING header's fields lie in a frame (after Ethernet, IPv4 and UDP): version
# (8 bits), frag and round (32 bits each).
_HDR = P.ETH_HEADER_BYTES + P.IPV4_HEADER_BYTES + P.UDP_HEADER_BYTES
VERSION_OFF, FRAG_OFF, ROUND_OFF = _HDR + 6, _HDR + 8, _HDR + 12


def aggregation_frames(rounds: int) -> list[tuple[int, bytearray]]:
    """Contributions of ports 1 and 2 to every slot of the pool, round after round: each
    (port, slot) frame is built once and copied with its round, version and fragment set
    (building each one afresh took ~8 s of every calibration). They carry no UDP checksum
    (0, which IPv4 allows), so no copy carries a wrong one."""
    vals = np.arange(P.K, dtype=np.int64)
    first = [(port, contribution(DEV, port, vals, job_id=1, slot=slot, round=0, frag=slot))
             for slot in range(POOL) for port in (1, 2)]
    out = []
    for r in range(rounds):
        for i, (port, template) in enumerate(first):
            frame = bytearray(template)
            frame[_HDR - 2:_HDR] = b"\0\0"
            frame[VERSION_OFF] = r & 1
            frame[FRAG_OFF:FRAG_OFF + 4] = (r * POOL + i // 2).to_bytes(4, "big")
            frame[ROUND_OFF:ROUND_OFF + 4] = r.to_bytes(4, "big")
            out.append((port, frame))
    return out


def next_rounds(frames: list[tuple[int, bytearray]], rounds: int) -> None:
    """Move every frame `rounds` rounds on (an even number keeps each frame's version), so
    that the cycle goes on with new rounds: the switch refuses a round it has left behind.
    The frames carry no UDP checksum, so they need no other change."""
    for _, frame in frames:
        r = int.from_bytes(frame[ROUND_OFF:ROUND_OFF + 4], "big")
        frame[ROUND_OFF:ROUND_OFF + 4] = ((r + rounds) & 0xFFFFFFFF).to_bytes(4, "big")


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, its threads included (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def blast(fabric: Fabric, frames: list, out_ports: list[int], seconds: float,
          window: int = 256, on_cycle=None) -> dict:
    """Send `frames` round-robin for `seconds` with at most `window` in flight, count frames
    out of `out_ports`; on_cycle(frames), if given, runs before each cycle after the first."""
    sw = fabric["s1"]
    for p in sw.test_ports.values():
        p.drain()
    socks = [sw.test_ports[p] for p in out_ports]
    sent = received = 0
    cpu0 = process_cpu_s(sw.proc.pid)
    t0 = time.monotonic()
    end = t0 + seconds
    i = cycle = 0
    n = len(frames)
    while time.monotonic() < end:
        while sent - received < window:
            if i // n != cycle and on_cycle is not None:
                cycle = i // n
                on_cycle(frames)
            port, frame = frames[i % n]
            try:
                sw.test_ports[port].send(frame)
                sent += 1
            except OSError:
                break  # socket buffer full
            i += 1
        got = 0
        for s in socks:
            while s.recv_nowait() is not None:
                got += 1
        received += got
        if not got:
            select.select([s.sock for s in socks], [], [], 0.001)
    elapsed = time.monotonic() - t0
    # Frames still in flight when sending stops (at most a window) were sent in the time and
    # still count; the switch's CPU is read once they are out, so it includes their work.
    settle = time.monotonic() + 0.5
    while time.monotonic() < settle and received < sent:
        for s in socks:
            while s.recv_nowait() is not None:
                received += 1
        time.sleep(0.01)
    cpu = process_cpu_s(sw.proc.pid) - cpu0
    pps = received / elapsed
    cpu_pps = received / cpu if cpu > 0 else pps
    return {"sent": sent, "out": received, "seconds": round(elapsed, 3),
            "pps": round(pps, 1), "offered_pps": round(sent / elapsed, 1),
            "switch_cpu_s": round(cpu, 3), "cpu_pps": round(cpu_pps, 1),
            "capacity_pps": round(max(pps, cpu_pps), 1)}


def run(target: str, seconds: float) -> dict:
    fabric = Fabric(target, {"s1": 4})
    try:
        sw = fabric["s1"]
        ForwardingTables(sw.conn).sync({host_mac(DEV, p): p for p in range(1, 5)},
                                          flood_ports=range(1, 5), flood_group=1)
        install_job(sw.conn, DEV, job_id=1, members={1: 0, 2: 1}, pool_size=POOL)
        fwd = blast(fabric, [(1, f) for f in forwarding_frames()], [3], seconds)
        agg = blast(fabric, aggregation_frames(rounds=50), [1, 2], seconds,
                    on_cycle=lambda frames: next_rounds(frames, 50))
        stats = StatsCounters(sw.conn).job(0)
    finally:
        fabric.close()
    agg["values_per_s"] = round(agg["capacity_pps"] * P.K)
    return {"target": target, "K": P.K, "frame_bytes": P.FRAME_BYTES, "forwarding": fwd,
            "aggregation": agg,
            "aggregation_over_forwarding": round(agg["capacity_pps"] / fwd["capacity_pps"], 3),
            "switch_counters": stats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=["bmv2", "model"], default="bmv2")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json-out", default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("switch_pps: needs root (veth interfaces)", file=sys.stderr)
        return 2
    res = run(args.target, args.seconds)
    f, a = res["forwarding"], res["aggregation"]
    print(f"{args.target}, K={P.K} ({P.FRAME_BYTES}-byte frames), packets/s out (per CPU "
          f"second of the switch): plain forwarding {f['pps']:.0f} ({f['cpu_pps']:.0f}), "
          f"aggregation {a['pps']:.0f} ({a['cpu_pps']:.0f}); capacity "
          f"{a['values_per_s']:.0f} values/s, aggregation / forwarding "
          f"{res['aggregation_over_forwarding']:.2f}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
