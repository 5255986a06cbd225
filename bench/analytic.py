"""What each all-reduce strategy should cost on a given fabric: the analytical model that the
benchmark's measurements are compared with (measured / predicted = how close an implementation
gets to its own limit).

A strategy's time is the largest of three bounds, each from rates measured in isolation:

* link: the most loaded link (bytes on the wire in one direction / its bandwidth). Links are
  full duplex; Mininet's shaping counts Ethernet frames, so headers are included.
* switch: the busiest switch's packets / its packet rate (aggregation packets for `passing` and
  `ina` at the switch's measured aggregation rate, TCP frames for the others at its measured
  forwarding rate).
* host: CPU work. On one benchmark machine every host, agent and switch process shares the same
  cores, so this is all agents' packets at the measured agent rate plus all switch packets at the
  switch rates, divided by the cores. (TCP's own CPU cost in the kernel and gloo is not modelled.)

Wire formats: a PASSING packet is one Ethernet frame of passing.protocol.FRAME_BYTES bytes
carrying K values; a stream of n values sends ceil(n/K) value packets plus one exponent packet
per slot it uses (passing.protocol.slots_used; the exponent of a slot's first block travels
ahead of it), or none when the call repeats the size of the one before and speculates on its
scale (docs/protocol.md, "Speculative scale"; the model assumes every prediction holds, as it
does for calls of the same tensor). TCP carries 1448
bytes per 1514-byte frame (MSS with timestamps) and one 66-byte ACK frame per two segments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from passing import protocol as P

TCP_MSS, TCP_FRAME = 1448, 1514
ACKS_PER_SEGMENT = 0.5


@dataclass(frozen=True)
class FabricModel:
    """The fabric as the model sees it: the job's hosts by rack (one rack: a single switch;
    several: ToRs under one spine) and the links' bandwidths. (testbed.fabric.Fabric is
    another thing: switch processes on veth pairs.)"""

    rack_hosts: tuple[int, ...]  # hosts of the job in each rack
    gpus: int  # local ranks per host
    host_bps: float  # host link bandwidth, bits/s (0: unshaped)
    uplink_bps: float = 0.0  # ToR-spine links (0: unshaped)

    @property
    def hosts(self) -> int:
        return sum(self.rack_hosts)

    @property
    def ranks(self) -> int:
        return self.hosts * self.gpus


@dataclass(frozen=True)
class Rates:
    """Packet rates measured on this machine, each component alone."""

    switch_agg_pps: float  # aggregation packets/s of one switch
    switch_fwd_pps: float  # plain forwarded frames/s of one switch
    agent_pps: float  # packets/s one agent stream sends and gets back
    cores: int = 2


@dataclass(frozen=True)
class Prediction:
    seconds: float
    bound: str  # link, switch or host
    link_s: float
    switch_s: float
    host_s: float
    host_link_bytes: float  # bytes one host link carries per direction (the busiest host)
    switch_packets: float  # packets all switches together process


def stream_packets(values: int, window: int, speculating: bool = False) -> int:
    blocks = math.ceil(values / P.K)
    return blocks if speculating else blocks + P.slots_used(window, blocks)


def _time(nbytes: float, bps: float) -> float:
    return nbytes * 8 / bps if bps > 0 else 0.0


def _tcp_wire(payload: float) -> float:
    """Bytes on the wire in the data direction for `payload` bytes of TCP payload."""
    return payload / TCP_MSS * TCP_FRAME


def _tcp_frames(payload: float) -> float:
    return payload / TCP_MSS * (1 + ACKS_PER_SEGMENT)


def predict(strategy: str, fabric: FabricModel, size_bytes: int, rates: Rates,
            window: int = 64, speculating: bool = False) -> Prediction:
    """The cost of one call; `speculating`: one that follows a call of the same size."""
    values = size_bytes // 4
    multi = len(fabric.rack_hosts) > 1
    if strategy in ("passing", "ina"):
        streams_per_host = fabric.gpus if strategy == "ina" else 1
        pkts = stream_packets(values, window, speculating) * streams_per_host  # per host, each way
        host_bytes = pkts * P.FRAME_BYTES
        link = _time(host_bytes, fabric.host_bps)
        up_pkts = stream_packets(values, window, speculating)  # one rack sum per ToR, one back
        if multi:
            link = max(link, _time(up_pkts * P.FRAME_BYTES, fabric.uplink_bps))
        # A ToR processes its hosts' packets, plus the spine's results when there is one.
        per_switch = [h * pkts + (up_pkts if multi else 0) for h in fabric.rack_hosts]
        if multi:
            per_switch.append(len(fabric.rack_hosts) * up_pkts)
        switch = max(per_switch) / rates.switch_agg_pps
        agent_work = fabric.hosts * pkts / rates.agent_pps
        host = (agent_work + sum(per_switch) / rates.switch_agg_pps) / rates.cores
        return _pick(link, switch, host, host_bytes, sum(per_switch))

    transfers = _tcp_transfers(strategy, fabric, float(size_bytes))
    rack_of = [r for r, h in enumerate(fabric.rack_hosts) for _ in range(h)]
    out_b = [0.0] * fabric.hosts
    in_b = [0.0] * fabric.hosts
    up_out = [0.0] * len(fabric.rack_hosts)
    up_in = [0.0] * len(fabric.rack_hosts)
    frames: dict[str, float] = {}
    for src, dst, payload in transfers:
        out_b[src] += payload
        in_b[dst] += payload
        crossed = [f"tor{rack_of[src]}"]
        if rack_of[src] != rack_of[dst]:
            up_out[rack_of[src]] += payload
            up_in[rack_of[dst]] += payload
            crossed += ["spine", f"tor{rack_of[dst]}"]
        for sw in crossed:
            frames[sw] = frames.get(sw, 0.0) + _tcp_frames(payload)
    host_bytes = _tcp_wire(max(out_b + in_b))
    link = _time(host_bytes, fabric.host_bps)
    if multi:
        link = max(link, _time(_tcp_wire(max(up_out + up_in)), fabric.uplink_bps))
    total = sum(frames.values())
    switch = max(frames.values(), default=0.0) / rates.switch_fwd_pps
    host = total / rates.switch_fwd_pps / rates.cores
    return _pick(link, switch, host, host_bytes, total)


def _tcp_transfers(strategy: str, fabric: FabricModel, n: float) -> list[tuple[int, int, float]]:
    """(source host, destination host, payload bytes) of every transfer between hosts; ranks
    on one host talk over loopback and cost no link."""
    hosts, ranks, gpus = fabric.hosts, fabric.ranks, fabric.gpus
    if hosts == 1:
        return []
    if strategy == "ring":  # one ring over every rank, host-major: one edge from host to host
        edge = 2 * (ranks - 1) / ranks * n
        return [(h, (h + 1) % hosts, edge) for h in range(hosts)]
    if strategy == "hier-ring":  # a ring over the hosts' leaders
        edge = 2 * (hosts - 1) / hosts * n
        return [(h, (h + 1) % hosts, edge) for h in range(hosts)]
    if strategy == "ps":  # the server is on host 0; every other rank pushes n, pulls n
        return [t for h in range(1, hosts) for t in ((h, 0, gpus * n), (0, h, gpus * n))]
    raise ValueError(f"no model for strategy {strategy!r}")


def _pick(link: float, switch: float, host: float, host_bytes: float,
          switch_packets: float) -> Prediction:
    bounds = {"link": link, "switch": switch, "host": host}
    bound = max(bounds, key=bounds.get)
    return Prediction(bounds[bound], bound, link, switch, host, host_bytes, switch_packets)
