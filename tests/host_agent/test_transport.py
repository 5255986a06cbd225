"""The agent's UDP socket takes datagrams from its switch's address and port only: a forged
result from anywhere else never reaches the window protocol."""

from __future__ import annotations

import socket

import pytest

from host_agent import transport
from host_agent.transport import UdpTransport


def _udp(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    return s


def test_only_the_switch_address_and_port_are_heard():
    switch, other_port, other_host = _udp("127.0.0.2"), _udp("127.0.0.2"), _udp("127.0.0.3")
    agent = UdpTransport("127.0.0.1", 0, *switch.getsockname())
    me = agent.sock.getsockname()
    try:
        other_port.sendto(b"forged: right address, wrong port", me)
        other_host.sendto(b"forged: another host", me)
        switch.sendto(b"result", me)
        got = []
        for _ in range(5):
            got += agent.recv(0.2)
        assert got == [b"result"]
        agent.send(b"contribution")
        assert switch.recvfrom(100) == (b"contribution", me)
    finally:
        for s in (switch, other_port, other_host):
            s.close()
        agent.close()


def test_a_switch_address_that_refuses_is_loss_not_a_crash():
    closed = _udp("127.0.0.2")
    addr = closed.getsockname()
    closed.close()  # the ICMP port-unreachable that follows surfaces on the next call
    agent = UdpTransport("127.0.0.1", 0, *addr)
    try:
        for _ in range(3):
            agent.send(b"x")
            assert agent.recv(0.05) == []
    finally:
        agent.close()


def test_a_route_whose_mtu_cannot_carry_a_packet_is_refused(monkeypatch):
    """An agent over links with a smaller MTU than its packets (PASSING_K=2048 without jumbo
    frames) says so at start: the kernel would fragment every packet and the switch drop each
    as malformed."""
    monkeypatch.setattr(transport, "_PACKET_IP_BYTES", 70000)  # more than loopback's 65536
    with pytest.raises(OSError, match=r"the route to 127\.0\.0\.2 has an MTU of 6553[56] bytes, "
                                      r"and one aggregation packet is 70000"):
        transport.UdpTransport("127.0.0.1", 0, "127.0.0.2", 9)
