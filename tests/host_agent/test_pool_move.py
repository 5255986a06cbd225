"""Live pool resizing on the agents' side (host_agent.pool_move): the vote that makes every host
change pools after the same call, and real processes moving while they sum, twice, with every
call's result checked."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import socket
import threading
import time
import traceback

import numpy as np
import pytest

from controller.switch import Update
from controller.tables.job_admission import JobAdmissionTables
from host_agent.pool_move import VOTE_LANES, PoolVote, call_size, pool_session, vote_offset
from passing import protocol as P
from passing.contract import JobParams
from testbed.loopback import InProcessConnection, UdpLoopbackSwitch
from tests.spawned import run_ranks

HOSTS, LOCAL = 2, 2
WORLD = HOSTS * LOCAL
N = 700  # values per call: not a multiple of K, so the vote shares no fragment with them


def free_port(kind=socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def params(window=8, pool=0, job_id=1) -> JobParams:
    sw = UdpLoopbackSwitch(2, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=window,
                           job_id=job_id)
    sw.close()
    return dataclasses.replace(sw.agent_params(), pool=pool)


# -- the vote ----------------------------------------------------------------------------------
def lanes_of(window: int | None) -> np.ndarray:
    """One host's vote lanes, as it streams them."""
    v = PoolVote(params())
    if window is not None:
        v.offer(dataclasses.replace(v.params, window=window, pool=1))
    return v.with_vote(np.zeros(0))


def test_the_vote_rides_in_a_fragment_of_its_own():
    assert vote_offset(700) == 3 * P.K and call_size(700) == 3 * P.K + VOTE_LANES
    assert vote_offset(P.K) == P.K and vote_offset(0) == 0
    v = PoolVote(params())
    x = np.arange(700, dtype=np.float64)
    out = v.with_vote(x)
    assert np.array_equal(out[:700], x)
    # Nothing to vote for: only the presence lane, so the fragment is never all zeros.
    assert list(out[vote_offset(700):]) == [1.0] + [0.0] * (VOTE_LANES - 1)
    assert v.offer(dataclasses.replace(v.params, window=0x1A3, pool=1))
    lanes = v.with_vote(x)[vote_offset(700):]
    assert list(lanes) == [1, 1, 3, 9, 10, 100, 1, 1, 0, 0]  # digits 3, A, 1, 0 of 0x1A3


def test_only_the_next_pool_of_the_same_job_is_taken():
    v = PoolVote(params())
    assert not v.offer(dataclasses.replace(v.params, window=4))  # the same pool again
    assert not v.offer(dataclasses.replace(v.params, window=4, pool=2))  # one skipped
    assert not v.offer(dataclasses.replace(params(job_id=2), window=4, pool=1))
    assert not v.offer(dataclasses.replace(v.params, pool=1, session_key="00" * 16))
    assert v.offer(dataclasses.replace(v.params, window=4, pool=1))


@pytest.mark.parametrize(("votes", "counts", "moves"), [
    ([4, 4], 2, True),  # both hosts voted for window 4
    ([4, None], 2, False),  # one host did not vote
    ([4, 8], 2, False),  # windows 4 and 8
    ([0x21, 0x12], 2, False),  # digits' sums alike (3 and 3), the windows not
    ([0x11, 0x11, 0x11, 0x33], 4, False),  # first digits sum to 6 = 4 * 1.5: not a digit
    ([300, 300], 1, False),  # the vote round closed by a quorum without one host
])
def test_hosts_move_only_when_all_voted_for_the_same_window(votes, counts, moves):
    v = PoolVote(params())
    mine = votes[0]
    nxt = dataclasses.replace(v.params, window=mine, pool=1)
    v.offer(nxt)
    v.with_vote(np.zeros(3))
    total = sum(lanes_of(w) for w in votes)
    got = v.decide(total, np.full(VOTE_LANES, counts), len(votes), len(votes))
    assert (got is nxt) == moves
    assert v.params is (nxt if moves else v.params)
    assert v.moves == ([(1, 1, mine)] if moves else [])


def test_a_host_that_did_not_vote_stays_whatever_the_sum_says():
    v = PoolVote(params())
    v.with_vote(np.zeros(3))
    assert v.decide(lanes_of(4) + lanes_of(4), np.full(VOTE_LANES, 2), 2, 2) is None


def test_the_vote_lanes_are_summed_exactly_by_the_fixed_point():
    """1024 hosts (32 racks of 32), a window of the largest digits: every lane's sum comes
    back exact."""
    from host_agent import fixed_point as fx

    hosts = 1024
    lanes = lanes_of(0xFFF)
    block = np.zeros((1, P.K))
    block[0, :VOTE_LANES] = lanes
    exp = fx.block_exponents(block)
    s = fx.scale_bits(hosts)
    total = fx.quantize(block, exp, s).astype(np.int64) * hosts
    assert np.all(np.abs(total) < 2**31)
    assert np.array_equal(fx.dequantize(total, exp, s)[0, :VOTE_LANES], lanes * hosts)


def test_each_pool_and_window_has_a_session_of_its_own():
    s = 0x1234_5678_9ABC_DEF0
    assert pool_session(s, 1, 8) == pool_session(s, 1, 8)
    assert len({s, pool_session(s, 1, 8), pool_session(s, 3, 8), pool_session(s, 1, 16),
                pool_session(s + 1, 1, 8)}) == 5
    assert 0 < pool_session(s, 1, 8) < 1 << 64


# -- real processes, a switch model behind UDP -------------------------------------------------
def worker(rank: int, port: int, first: JobParams, path: str, until: int,
           out: mp.Queue) -> None:
    try:
        import torch
        import torch.distributed as dist

        from host_agent.allreduce import PassingAllreduce

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        groups = [dist.new_group(list(range(h * LOCAL, (h + 1) * LOCAL))) for h in range(HOSTS)]
        host = rank // LOCAL
        passing = PassingAllreduce(first, f"h{host + 1}", groups[host], rto=0.05,
                                   params_source=lambda: JobParams.load(path), poll=0.05)
        base = torch.arange(N, dtype=torch.float32) % 97
        wrong, calls, after_last = [], 0, 0
        flag = torch.zeros(1)
        while True:
            t = base * (rank + 1) + calls
            passing.allreduce(t)
            expected = base * sum(range(1, WORLD + 1)) + WORLD * calls
            if not torch.equal(t, expected):
                wrong.append(calls)
            calls += 1
            moved = len(passing.stream.vote.moves) if passing.stream is not None else 0
            # Every rank stops at the same call: the leaders know when they moved.
            flag[0] = moved
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            after_last = after_last + 1 if int(flag[0]) >= until else 0
            if after_last > 5 or calls > 1000:
                break
            time.sleep(0.005)
        report = {"rank": rank, "wrong": wrong, "calls": calls}
        if passing.stream is not None:
            cfg = passing.streamer.cfg
            report.update(moves=passing.stream.vote.moves, window=cfg.window, pool=cfg.pool)
        passing.close()
        dist.destroy_process_group()
        out.put(report)
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


def pool_contribs(sw: UdpLoopbackSwitch, pool: int) -> list[int]:
    cells = sw.pipe.state.counters["pool_contribs"]
    return [cells[pool * P.MAX_FAN_IN + c][0] for c in range(HOSTS)]


def test_hosts_move_to_a_resized_pool_and_back_while_summing(tmp_path):
    """Shrink 8 -> 3 slots into pool 1, then grow to 12 in pool 0 again, as the controller
    does it: each new pool is installed before the parameters say so, and the old one is
    removed only once every host has contributed to the new one. Every result of every call
    is exact; every host moves after the same call."""
    sw = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=8)
    conn = InProcessConnection(sw.service)
    adm = JobAdmissionTables(conn)
    first = sw.agent_params()
    path = tmp_path / "job.json"
    path.write_text(first.to_json())
    errors = []

    def wait_all_on(pool: int) -> None:
        deadline = time.monotonic() + 60
        while min(pool_contribs(sw, pool)) == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"hosts never all used pool {pool}")
            time.sleep(0.05)

    def resize() -> None:
        try:
            wait_all_on(0)  # the job runs in its first pool
            time.sleep(0.3)
            job = sw.entries.job
            one = dataclasses.replace(job, pool=1, pool_base=100, pool_size=3, gen=2)
            conn.write([adm.job_update(Update.INSERT, one)])
            path.write_text(json.dumps(dataclasses.replace(first, window=3, pool=1).to_dict()))
            wait_all_on(1)
            conn.write([adm.job_delete(job.job_id, 0)])
            # Counters of the pool a resize reuses start at zero, as the controller leaves them.
            for c in range(HOSTS):
                sw.pipe.state.counters["pool_contribs"][c] = [0, 0]
            two = dataclasses.replace(job, pool=0, pool_base=200, pool_size=12, gen=3)
            conn.write([adm.job_update(Update.INSERT, two)])
            path.write_text(json.dumps(dataclasses.replace(first, window=12,
                                                           pool=2).to_dict()))
            wait_all_on(0)
            conn.write([adm.job_delete(job.job_id, 1)])
        except Exception:
            errors.append(traceback.format_exc())

    mover = threading.Thread(target=resize)
    mover.start()
    try:
        port = free_port()
        results = run_ranks(worker, WORLD, lambda r: (r, port, first, str(path), 2),
                            timeout=240)
    finally:
        mover.join(70)
        sw.close()
    assert not errors, errors[0]
    for r in range(WORLD):
        assert results[r]["wrong"] == [], f"rank {r}: wrong sums in calls {results[r]['wrong']}"
    leaders = [results[h * LOCAL] for h in range(HOSTS)]
    assert all(len(x["moves"]) == 2 for x in leaders), leaders
    assert leaders[0]["moves"] == leaders[1]["moves"], "the hosts moved after different calls"
    assert [(p, w) for _, p, w in leaders[0]["moves"]] == [(1, 3), (2, 12)]
    assert all((x["window"], x["pool"]) == (12, 0) for x in leaders)
