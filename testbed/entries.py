"""Test-side job setup and packet crafting, shared by the data-plane tests.

Addresses follow one scheme: host on port p of switch d has MAC 02:00:00:00:0d:pp, IPv4
10.0.d.p and agent UDP port 50000+p; a switch's own aggregation address is .254 / :fe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller import installer
from controller.installer import Desired
from controller.switch import SwitchWriter
from controller.tables.job_admission import JobConfig
from controller.tables.peers import Peer
from passing import packet
from passing import protocol as P
from testbed.scapy_layer import Passing  # noqa: F401  (binds the layer for decoding)


def host_mac(dev: int, port: int) -> str:
    return f"02:00:00:00:{dev:02x}:{port:02x}"


def host_ip(dev: int, port: int) -> str:
    return f"10.0.{dev}.{port}"


def switch_mac(dev: int) -> str:
    return f"02:00:00:00:{dev:02x}:fe"


def switch_ip(dev: int) -> str:
    return f"10.0.{dev}.254"


def agent_port(port: int, rank: int = 0) -> int:
    """UDP port of the rank-th contributor behind switch port `port`."""
    return 50000 + 100 * rank + port


@dataclass
class Uplink:
    port: int  # this switch's port towards the spine
    contributor: int  # this switch's id at the spine
    spine_dev: int


def job_entries(dev: int, job_id: int, members: dict[int, int | tuple[int, int]], *,
                pool_base: int = 0, pool_size: int = 16, gen: int = 1, stat_idx: int = 0,
                mcast_grp: int | None = None, uplink: Uplink | None = None,
                member_switches: dict[int, int] | None = None, guard: bool = True,
                agent_port_of: Callable[[int, int], int] = agent_port,
                quorum: int = 0) -> Desired:
    """A job's entries on switch `dev` under this module's address scheme, as the installer
    describes them (see install_job for the parameters); agent_port_of(port, rank): the UDP
    port a member's rank-th contributor receives results on; quorum: what a CLOSE request
    may complete a round with (0: the fan-in)."""
    grp = mcast_grp if mcast_grp is not None else 100 + job_id
    ranges = {port: m if isinstance(m, tuple) else (m, 1) for port, m in members.items()}
    switches = member_switches or {}
    fan_in = sum(n for _, n in ranges.values()) + len(switches)
    d = Desired(JobConfig(job_id, pool_base, pool_size, fan_in, grp, gen,
                          int(uplink is None), uplink.port if uplink else 0, stat_idx,
                          quorum))
    for port, (first, count) in ranges.items():
        d.members[port] = (first, count)
        for rank in range(count):
            udp_port = agent_port_of(port, rank)
            d.peers[port, first + rank] = Peer(host_mac(dev, port), switch_mac(dev),
                                               host_ip(dev, port), switch_ip(dev), udp_port,
                                               first + rank)
            d.replicas.append((port, first + rank))
            if guard:
                d.guards[udp_port] = stat_idx
    # A spine numbers its member switches after its hosts, in the dict's order.
    for cid, (port, tor_dev) in enumerate(switches.items(), start=fan_in - len(switches)):
        d.members[port] = (cid, 1)
        d.peers[port, cid] = Peer(switch_mac(tor_dev), switch_mac(dev), switch_ip(tor_dev),
                                  switch_ip(dev), P.PASSING_UDP_PORT, cid)
        d.replicas.append((port, cid))
    if uplink is not None:
        d.peers[uplink.port, 0] = Peer(switch_mac(uplink.spine_dev), switch_mac(dev),
                                       switch_ip(uplink.spine_dev), switch_ip(dev),
                                       P.PASSING_UDP_PORT, uplink.contributor)
    return d


def install_job(sw: SwitchWriter, dev: int, job_id: int,
                members: dict[int, int | tuple[int, int]], *,
                pool_base: int = 0, pool_size: int = 16, gen: int = 1, stat_idx: int = 0,
                mcast_grp: int | None = None, uplink: Uplink | None = None,
                member_switches: dict[int, int] | None = None,
                guard: bool = True, quorum: int = 0) -> JobConfig:
    """Install a job on switch `dev` with the controller's installer (all entries or none).
    members: port -> contributor id of a host, or (first id, count) for a host whose ranks
    stream on their own (switch-only INA; rank i receives on agent_port(port, i));
    member_switches: port -> (ToR) device id of member switches (at a spine: their contributor
    id is the key's position in the dict order); guard: reserve the agents' result ports
    (result_guard), as the controller does."""
    d = job_entries(dev, job_id, members, pool_base=pool_base, pool_size=pool_size, gen=gen,
                    stat_idx=stat_idx, mcast_grp=mcast_grp, uplink=uplink,
                    member_switches=member_switches, guard=guard, quorum=quorum)
    installer.install(sw, d)
    return d.job


# The session of the test's own agents, unless a test says otherwise.
SESSION = 0x5E55_1011_0000_0001


def to_switch(dev: int, port: int, payload: bytes, sport: int | None = None, *,
              udp_chksum: int | None = None) -> bytes:
    """The frame an agent's UDP datagram becomes on the wire: from the host on switch `dev`'s
    port `port` (UDP source port `sport`, default its agent port) to the switch's aggregation
    address; udp_chksum=0 sends it without a UDP checksum."""
    udp = UDP(sport=agent_port(port) if sport is None else sport, dport=P.PASSING_UDP_PORT)
    if udp_chksum is not None:
        udp.chksum = udp_chksum
    return bytes(Ether(dst=switch_mac(dev), src=host_mac(dev, port))
                 / IP(src=host_ip(dev, port), dst=switch_ip(dev)) / udp / payload)


def contribution(dev: int, port: int, values, *, job_id: int, slot: int = 0,
                 version: int | None = None,
                 contributor: int | None = None, frag: int = 0, num_contrib: int = 1,
                 exp: int = 0, flags: int = int(P.Flag.CONTRIB), level: int = 0,
                 tag: int = 0, session: int = SESSION, round: int | None = None,
                 pool: int = 0) -> bytes:
    """A full frame as a host on `port` would send it to its switch. Give `round` (the version
    is pool `pool`'s epoch and the round's low bit) or `version` (the whole byte: the slot's
    first or second round, plus any epoch); both only to send a version that does not match
    the round. Neither: round 0. An odd `pool` sets FLAG_POOL too."""
    rnd = {k: v for k, v in (("version", version), ("round", round)) if v is not None} \
        or {"round": 0}
    payload = packet.pack(np.asarray(values, dtype=np.int64), pool=pool, job_id=job_id,
                          slot=slot, **rnd, contributor=port - 1 if contributor is None
                          else contributor, frag=frag, num_contrib=num_contrib, exp=exp,
                          flags=flags | (int(P.Flag.POOL) if pool & 1 else 0), level=level,
                          tag=tag, session=session)
    return to_switch(dev, port, payload)


def ipv4_checksum_ok(pkt) -> bool:
    """One's complement sum over the IPv4 header, checksum included, is 0xffff."""
    hdr = bytes(pkt[IP])[:20]
    total = sum(int.from_bytes(hdr[i:i + 2], "big") for i in range(0, 20, 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def decode(frame: bytes):
    """(scapy packet, numpy record of the PASSING payload) of a frame the switch sent."""
    pkt = Ether(frame)
    return pkt, packet.unpack(bytes(pkt[UDP].payload))


def received_decoded(sw, port: int, n: int, timeout: float = 5.0) -> list:
    """Up to `n` frames on test port `port` of `sw`, each decoded whole (headers and values),
    waiting at most `timeout` for each batch: fewer if no more come."""
    frames: list[bytes] = []
    while len(frames) < n:
        got = sw.test_ports[port].recv(n - len(frames), timeout)
        if not got:
            break
        frames += got
    return [decode(f) for f in frames]


def received(sw, port: int, n: int, timeout: float = 5.0) -> list:
    """As `received_decoded`, each frame's PASSING header only."""
    return [d[1] for d in received_decoded(sw, port, n, timeout)]


def results_at(fabric, switches, hosts=(1, 2), timeout: float = 3.0) -> dict:
    """The first result each test port `hosts` of each of `switches` receives, decoded, by
    (switch, port); a port that receives none within `timeout` fails the test naming it."""
    out = {}
    for sw in switches:
        for h in hosts:
            frames = fabric[sw].test_ports[h].recv(1, timeout)
            assert frames, f"{sw} host {h}: no result"
            out[(sw, h)] = decode(frames[0])[1]
    return out


class PortTransport:
    """A host agent's transport on a fabric's test port: the agent's payloads leave as frames
    from the host on switch `dev`'s port `port`; only frames the switch addressed to that host's
    agent port, from the switch's address and port 48879, come back (what the agent's connected
    UDP socket lets through)."""

    def __init__(self, test_port, dev: int, port: int, rank: int = 0):
        self.test_port, self.dev, self.port = test_port, dev, port
        self.udp_port = agent_port(port, rank)

    def send(self, payload: bytes) -> None:
        self.test_port.send(to_switch(self.dev, self.port, payload, self.udp_port))

    def recv(self, timeout: float) -> list[bytes]:
        frames = self.test_port.recv(1, timeout)
        while frames and (more := self.test_port.recv_nowait()) is not None:
            frames.append(more)
        out = []
        for frame in frames:
            pkt = Ether(frame)
            if (IP in pkt and UDP in pkt and pkt[IP].src == switch_ip(self.dev)
                    and pkt[IP].dst == host_ip(self.dev, self.port)
                    and pkt[UDP].sport == P.PASSING_UDP_PORT
                    and pkt[UDP].dport == self.udp_port):
                out.append(bytes(pkt[UDP].payload))
        return out
