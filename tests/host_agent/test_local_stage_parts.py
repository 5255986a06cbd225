"""The pieces of the shared-memory local stage, each alone in one process: the shared file and
its regions (host_agent/local_stage_memory.py), the leader's messages to the other ranks over
their channel (host_agent/local_stage_links.py) and the agreement over that channel
(host_agent/local_stage_agree.py). tests/host_agent/test_local_stage.py runs them together
in real gloo groups."""

from __future__ import annotations

import errno
import os
import select
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from host_agent.local_channel import Link
from host_agent.local_stage_agree import Agreement, Call, LocalStageMismatch
from host_agent.local_stage_links import MISMATCH, OK, LeaderLinks
from host_agent.local_stage_memory import SharedMapping

NAME = "passing-test-parts"


def _mappings(tmp_path: Path, capacity: int, size: int = 3) -> list[SharedMapping]:
    mappings = [SharedMapping(tmp_path, NAME, r, size) for r in range(size)]
    for m in mappings:
        m.grow(capacity)
    return mappings


def test_ranks_mapping_one_file_see_each_others_tokens_inputs_and_result(tmp_path):
    leader, one, two = _mappings(tmp_path, 8)
    assert leader.tokens() == two.tokens() == [leader.token, one.token, two.token]
    one.region(1, 8).copy_(torch.full((8,), 1.0))
    two.region(2, 8).copy_(torch.full((8,), 2.0))
    leader.result(8, torch.float64).copy_(torch.arange(8, dtype=torch.float64))
    assert leader.region(1, 8).tolist() == [1.0] * 8
    assert leader.region(2, 8).tolist() == [2.0] * 8
    assert one.result(8, torch.float64).tolist() == list(range(8))
    assert one.tokens() == leader.tokens()  # no region reaches into the header


def test_a_region_written_past_its_capacity_is_refused(tmp_path):
    leader, one, _ = _mappings(tmp_path, 8)
    with pytest.raises(ValueError):
        one.region(1, 9)
    with pytest.raises(ValueError):
        leader.result(9, torch.float32)
    leader.close()
    with pytest.raises(ValueError):  # nothing mapped
        leader.region(1, 1)


def test_a_larger_mapping_is_a_new_file_and_the_old_one_can_go(tmp_path):
    (m,) = _mappings(tmp_path, 4, size=1)
    first = m.path
    m.grow(16)
    assert (m.gen, m.capacity) == (2, 16) and m.path != first
    first.unlink()
    m.unlink()
    m.close()
    m.close()  # idempotent
    assert list(tmp_path.iterdir()) == []


def test_no_directory_or_no_room_fails_when_the_mapping_is_made(tmp_path, monkeypatch):
    with pytest.raises(OSError):
        SharedMapping(tmp_path / "missing", NAME, 0, 2).grow(8)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    m = SharedMapping(tmp_path, NAME, 0, 2)
    with pytest.raises(OSError):
        m.grow(8)
    assert m.map is None and m.capacity == 0


@pytest.fixture
def channel():
    """A leader and two other ranks, joined as local_channel joins them."""
    leader, ranks, socks = LeaderLinks(0), {}, []
    for r in (1, 2):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socks += [a, b]
        leader.links[r] = Link(a, r, 5.0)
        ranks[r] = LeaderLinks(r)
        ranks[r].links[0] = Link(b, 0, 5.0)
    yield leader, ranks
    for s in socks:
        s.close()


def test_the_leaders_status_and_count_reach_every_rank(channel):
    leader, ranks = channel
    assert leader.share_status(3, 1, "the switch timed out") == (3, 1, "the switch timed out")
    assert [ranks[r].share_status(0, 0, "") for r in (1, 2)] == \
        [(3, 1, "the switch timed out")] * 2
    assert leader.share_count(-2) == -2
    assert [ranks[r].share_count(0) for r in (1, 2)] == [-2, -2]


def test_a_rank_gone_during_an_ok_status_fails_nobody_until_the_next_call(channel):
    leader, ranks = channel
    ranks[1].close()
    assert leader.share_status(OK, 0, "") == (OK, 0, "")  # this call's result stands
    assert ranks[2].share_status(0, 0, "") == (OK, 0, "")
    with pytest.raises(RuntimeError, match="local rank 1"):  # told why, at the next call
        ranks[2].share_count(0)
    for side in (leader, ranks[2]):
        with pytest.raises(RuntimeError, match="local rank 1"):
            side.check()


def test_a_rank_gone_during_a_failed_status_fails_the_leader_at_once(channel):
    leader, ranks = channel
    ranks[1].close()
    with pytest.raises(RuntimeError, match="local rank 1"):
        leader.share_status(5, 0, "the leader failed")
    assert ranks[2].share_status(0, 0, "") == (5, 0, "the leader failed")


def _call(numel: int, remapped: bool = False) -> Call:
    return Call(numel, torch.float32, 1, remapped, 16, 0, 0)


def test_ranks_calling_alike_go_on_without_a_word_back(channel):
    leader, ranks = channel
    for r in (1, 2):
        assert Agreement(None, r, 3, 5.0).by_channel(_call(10), ranks[r])
    assert Agreement(None, 0, 3, 5.0).by_channel(_call(10), leader)
    waiting = [ranks[r].links[0].sock for r in (1, 2)]
    assert select.select(waiting, [], [], 0)[0] == []  # the status will say the rest


def test_a_rank_calling_with_another_size_fails_every_rank(channel):
    leader, ranks = channel
    assert Agreement(None, 1, 3, 5.0).by_channel(_call(10), ranks[1])
    assert Agreement(None, 2, 3, 5.0).by_channel(_call(11), ranks[2])
    with pytest.raises(LocalStageMismatch):
        Agreement(None, 0, 3, 5.0).by_channel(_call(10), leader)
    for r in (1, 2):  # each learns it from the status it waits for
        assert ranks[r].share_status(0, 0, "")[0] == MISMATCH


def _agree_together(channel, calls: dict[int, Call]) -> dict[int, object]:
    """Every rank's by_channel at once (a rank that made a new mapping waits for the
    leader's verdict): what each returned, or the exception it raised."""
    leader, ranks = channel
    sides = {0: leader, **ranks}

    def one(r: int) -> object:
        try:
            return Agreement(None, r, 3, 5.0).by_channel(calls[r], sides[r])
        except Exception as e:
            return e
    with ThreadPoolExecutor(3) as pool:
        done = {r: pool.submit(one, r) for r in sides}
    return {r: f.result() for r, f in done.items()}


def test_ranks_that_all_made_a_new_mapping_meet_in_the_group(channel):
    got = _agree_together(channel, {r: _call(40, remapped=True) for r in range(3)})
    assert got == {0: False, 1: False, 2: False}


def test_a_rank_that_made_a_new_mapping_alone_fails_with_every_rank(channel):
    got = _agree_together(channel, {0: _call(10), 1: _call(10), 2: _call(40, remapped=True)})
    assert isinstance(got[0], LocalStageMismatch) and isinstance(got[2], LocalStageMismatch)
    assert got[1] is True  # it learns it from the status
    assert channel[1][1].share_status(0, 0, "")[0] == MISMATCH
