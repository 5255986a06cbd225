"""The local ranks' channel (host_agent/local_channel.py) in one process: the leader takes
every rank's connection or none, never one with a wrong token or a rank taken twice; a
message out of step, a closed end or a silent one is an error, never read as the next one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from host_agent import local_channel
from host_agent.local_channel import HELLO, READY, STATUS, ChannelBroken

TOKENS = [0, 0x1111, 0x2223, 0x3335]  # the leader's own first, never sent


def _raw(path: Path, payload: bytes) -> socket.socket:
    """A connection that says whatever it is given (a forger's, or a confused rank's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(path))
    sock.send(payload)
    return sock


def test_the_leader_takes_every_rank_and_nothing_else(tmp_path: Path):
    path = tmp_path / "stage.ch"
    listener = local_channel.listen(path, 16)
    assert listener is not None and path.exists()
    hello = local_channel._HEAD.pack(HELLO, 0)
    forged = [_raw(path, hello + local_channel._HELLO.pack(1, 0x9999)),  # wrong token
              _raw(path, hello + local_channel._HELLO.pack(7, 0x1111)),  # no such rank
              _raw(path, b"x"),  # not a hello at all
              _raw(path, local_channel._HEAD.pack(READY, 0) + bytes(12))]
    ranks = {r: local_channel.connect(path, r, TOKENS[r], 5.0) for r in (1, 2, 3)}
    # rank 2 again, with its own token: taken once only (the first)
    forged.append(_raw(path, hello + local_channel._HELLO.pack(2, TOKENS[2])))
    links = local_channel.accept_all(listener, path, TOKENS, 5.0)
    assert links is not None and sorted(links) == [1, 2, 3]
    assert not path.exists()
    assert all(local_channel.welcomed(ranks[r]) for r in (1, 2, 3))
    for sock in forged:  # closed unread (reset, as data was left), told nothing
        sock.settimeout(5.0)
        try:
            assert sock.recv(64) == b""
        except ConnectionResetError:
            pass
    # Each link speaks for its rank, numbered from the hello on.
    for r in (1, 2, 3):
        ranks[r].send(READY, bytes([r]))
    assert [links[r].recv(READY) for r in (1, 2, 3)] == [(READY, bytes([r])) for r in (1, 2, 3)]
    links[3].send(STATUS, b"ok")
    assert ranks[3].recv(STATUS) == (STATUS, b"ok")


def test_a_missing_rank_means_no_channel_for_anyone(tmp_path: Path):
    path = tmp_path / "stage.ch"
    listener = local_channel.listen(path, 16)
    one = local_channel.connect(path, 1, TOKENS[1], 5.0)
    three = local_channel.connect(path, 3, TOKENS[3], 5.0)
    assert local_channel.accept_all(listener, path, TOKENS, 5.0) is None
    assert not local_channel.welcomed(one) and not local_channel.welcomed(three)
    assert not path.exists()


def test_a_name_that_is_taken_or_too_long_makes_no_listener(tmp_path: Path):
    taken = tmp_path / "taken.ch"
    taken.write_text("someone else's")
    assert local_channel.listen(taken, 4) is None
    assert taken.read_text() == "someone else's"  # never replaced
    assert local_channel.listen(tmp_path / ("n" * 120), 4) is None
    assert local_channel.connect(tmp_path / "nobody.ch", 1, 5, 1.0) is None


def _pair(timeout: float = 5.0) -> tuple[local_channel.Link, local_channel.Link]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return local_channel.Link(a, 1, timeout), local_channel.Link(b, 0, timeout)


def test_out_of_step_closed_and_silent_ends_are_errors():
    leader, rank = _pair()
    rank.send(READY, b"1")
    with pytest.raises(ChannelBroken, match="out of step"):
        leader.recv(STATUS)  # a READY where a STATUS was due
    leader, rank = _pair()
    rank.sock.send(local_channel._HEAD.pack(READY, 5) + b"x")  # a message skipped
    with pytest.raises(ChannelBroken, match="out of step"):
        leader.recv(READY)
    leader, rank = _pair()
    rank.sock.send(b"\x01")
    with pytest.raises(ChannelBroken, match="runt"):
        leader.recv(READY)
    leader, rank = _pair()
    rank.close()
    with pytest.raises(ChannelBroken, match="closed its end"):
        leader.recv(READY)
    with pytest.raises(ChannelBroken, match="cannot be told"):
        leader.send(STATUS, b"x")
    leader, rank = _pair(timeout=0.2)
    with pytest.raises(ChannelBroken, match="said nothing"):
        leader.recv(READY)
