"""Ordinary traffic is forwarded by the L2 table, so hosts can ping and talk to each other."""

from __future__ import annotations

from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from controller.tables.forwarding import ForwardingTables
from passing import protocol as P
from testbed.entries import host_ip, host_mac

DEV = 0


def test_known_unicast_goes_to_its_port_and_broadcast_floods(star):
    sw = star["s1"]
    ForwardingTables(sw.conn).sync({host_mac(DEV, p): p for p in range(1, 6)},
                                      flood_ports=range(1, 6), flood_group=1)
    ping = bytes(Ether(src=host_mac(DEV, 1), dst=host_mac(DEV, 4))
                 / IP(src=host_ip(DEV, 1), dst=host_ip(DEV, 4)) / ICMP())
    sw.test_ports[1].send(ping)
    got = sw.test_ports[4].recv(1, 2)
    assert got and got[0] == ping
    assert all(sw.test_ports[p].recv(1, 0.3) == [] for p in (1, 2, 3, 5))

    arp = bytes(Ether(src=host_mac(DEV, 2), dst="ff:ff:ff:ff:ff:ff")
                / ARP(psrc=host_ip(DEV, 2), pdst=host_ip(DEV, 3)))
    sw.test_ports[2].send(arp)
    for p in (1, 3, 4, 5):
        frames = sw.test_ports[p].recv(1, 2)
        assert frames and frames[0] == arp, f"broadcast did not reach port {p}"
    assert sw.test_ports[2].recv(1, 0.3) == []  # never back out of its ingress port


def test_other_udp_ports_are_ordinary_traffic(star):
    """UDP to any port but 48879 is forwarded, unless it claims to come from a switch (source
    port 48879) or goes to a port reserved for a job's agents (tests/conformance/
    test_integrity.py)."""
    sw = star["s1"]
    ForwardingTables(sw.conn).sync({host_mac(DEV, 3): 3}, flood_ports=range(1, 6),
                                      flood_group=1)
    for dport in (P.PASSING_UDP_PORT + 1, 53, 61000):
        frame = bytes(Ether(src=host_mac(DEV, 1), dst=host_mac(DEV, 3))
                      / IP(src=host_ip(DEV, 1), dst=host_ip(DEV, 3))
                      / UDP(sport=40000, dport=dport) / (b"x" * 50))
        sw.test_ports[1].send(frame)
        got = sw.test_ports[3].recv(1, 2)
        assert got and got[0] == frame, dport
