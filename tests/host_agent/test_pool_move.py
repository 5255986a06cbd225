"""Live pool resizing and live policy changes on the agents' side (host_agent.pool_move): the vote
that makes every host change pools, or patience and staleness bound, after the same call; real
processes moving while they sum, twice, with every call's result checked; real processes changing
from waiting for everyone to a quorum with a staleness bound and back, with a straggler."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import socket
import threading
import time
import traceback
from pathlib import Path

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
def lanes_of(window: int | None, policy: int = 0, pool: int = 1) -> np.ndarray:
    """One host's vote lanes, as it streams them (voting for `window`, `policy` and `pool`;
    None: not voting)."""
    v = PoolVote(params())
    if window is not None:
        assert v.offer(dataclasses.replace(v.params, window=window, pool=pool, policy=policy))
    return v.with_vote(np.zeros(0))


def test_the_vote_rides_in_a_fragment_of_its_own():
    assert vote_offset(700) == 3 * P.K and call_size(700) == 3 * P.K + VOTE_LANES
    assert vote_offset(P.K) == P.K and vote_offset(0) == 0
    v = PoolVote(params())
    x = np.arange(700, dtype=np.float64)
    out = v.with_vote(x)
    assert np.array_equal(out[:700], x)
    # Nothing newer: a vote for what it holds (pool 0, window 8, policy 0), after the
    # presence lane; each digit d as d, d^2, lowest digit first.
    window_8 = [8, 64, 0, 0, 0, 0, 0, 0]
    assert list(out[vote_offset(700):]) == [1] + [0] * 16 + window_8 + [0] * 16
    assert v.offer(dataclasses.replace(v.params, window=0x1A3, pool=1))
    lanes = v.with_vote(x)[vote_offset(700):]
    # Pool 1, then the window's digits 3, A, 1, 0 (0x1A3), then policy 0's eight.
    assert list(lanes) == [1, 1, 1] + [0] * 14 + [3, 9, 10, 100, 1, 1, 0, 0] + [0] * 16
    v = PoolVote(params())
    assert v.offer(dataclasses.replace(v.params, policy=0x2F))  # a new policy alone
    lanes = v.with_vote(x)[vote_offset(700):]
    assert list(lanes) == [1] + [0] * 16 + window_8 + [15, 225, 2, 4] + [0] * 12


def test_only_the_next_pool_of_the_same_job_is_taken():
    v = PoolVote(params())
    assert not v.offer(dataclasses.replace(v.params, window=4))  # the same pool again
    assert not v.offer(dataclasses.replace(v.params, window=4, pool=2))  # one skipped
    assert not v.offer(dataclasses.replace(params(job_id=2), window=4, pool=1))
    assert not v.offer(dataclasses.replace(v.params, pool=1, session_key="00" * 16))
    assert v.offer(dataclasses.replace(v.params, window=4, pool=1))
    assert v.offer(dataclasses.replace(v.params, window=4, pool=1, policy=3))  # both at once


def test_only_a_newer_policy_of_the_same_pool_is_taken():
    v = PoolVote(dataclasses.replace(params(), policy=2))
    assert not v.offer(dataclasses.replace(v.params, policy=1))  # older
    assert not v.offer(dataclasses.replace(v.params, patience=(0.5,)))  # no new number
    assert not v.offer(dataclasses.replace(v.params, policy=3, window=4))  # a window, no pool
    assert not v.offer(dataclasses.replace(v.params, policy=1, pool=1))  # a move, policy older
    assert v.offer(dataclasses.replace(v.params, policy=5, staleness=3))  # any newer one
    # A source that briefly serves older parameters than it did changes nothing.
    assert not v.offer(dataclasses.replace(v.params, policy=4))
    assert v.offer(dataclasses.replace(v.params, policy=5, staleness=3))  # the same again
    assert v.offer(dataclasses.replace(v.params, policy=6, pool=1))  # then a move with it
    assert not v.offer(dataclasses.replace(v.params, policy=7))  # not back to the same pool


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


@pytest.mark.parametrize(("votes", "moves"), [
    ([(8, 1, 0), (8, 1, 0)], True),  # both: policy 1 in the same pool
    ([(8, 1, 0), (8, 2, 0)], False),  # one saw a later change than the other
    ([(8, 1, 0), (8, 1, 1)], False),  # one moves pools as well, the other not
    ([(8, 0x10, 0), (8, 0x01, 0)], False),  # digits 1 and 0 in other places
    ([(8, 1, 0), None], False),  # the other has not polled yet: it votes for what it holds
])
def test_hosts_change_policy_only_when_all_voted_for_the_same_one(votes, moves):
    v = PoolVote(params())
    mine = dataclasses.replace(v.params, policy=votes[0][1], pool=votes[0][2],
                               staleness=4)
    v.offer(mine)
    v.with_vote(np.zeros(3))
    total = sum(lanes_of(None) if vote is None else lanes_of(*vote) for vote in votes)
    got = v.decide(total, np.full(VOTE_LANES, 2), 2, 2)
    assert (got is mine) == moves
    assert v.policies == ([(1, votes[0][1])] if moves else [])
    assert v.moves == []  # the pool stayed


def test_a_host_that_knows_nothing_newer_stays_whatever_the_sum_says():
    v = PoolVote(params())
    v.with_vote(np.zeros(3))
    assert v.decide(lanes_of(4) + lanes_of(4), np.full(VOTE_LANES, 2), 2, 2) is None
    v.with_vote(np.zeros(3))  # its own vote: everyone holds what it holds
    assert v.decide(lanes_of(None) + lanes_of(None), np.full(VOTE_LANES, 2), 2, 2) is None
    assert v.moves == v.policies == []


def test_a_host_left_behind_catches_up_with_the_others_votes():
    """The others changed to policy 3 without this host (a forged vote could do that); they
    vote for what they hold, so once this host has polled policy 3 too, the votes agree and it
    changes: the split does not last."""
    v = PoolVote(params())
    newer = dataclasses.replace(v.params, policy=3, staleness=2)
    v.offer(newer)
    v.with_vote(np.zeros(3))
    ahead = PoolVote(newer).with_vote(np.zeros(0))  # a host already on policy 3
    assert v.decide(ahead + ahead, np.full(VOTE_LANES, 2), 2, 2) is newer
    assert v.policies == [(1, 3)] and v.params is newer


def test_the_vote_lanes_are_summed_exactly_by_the_fixed_point():
    """1024 hosts (32 racks of 32), a window of the largest digits: every lane's sum comes
    back exact."""
    from host_agent import fixed_point as fx

    hosts = 1024
    lanes = lanes_of(0xFFF, policy=0x7FFFFFFF)
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
def polling_allreduce(rank: int, port: int, first: JobParams, path: str, **options):
    """This rank's PassingAllreduce, its host's ranks its local group, its leader polling the
    parameters in file `path` (after joining the world process group, gloo)."""
    import torch.distributed as dist

    from host_agent.allreduce import PassingAllreduce

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    groups = [dist.new_group(list(range(h * LOCAL, (h + 1) * LOCAL))) for h in range(HOSTS)]
    # The hosts' leaders: where they sum while the job waits for switch slots (window 0).
    leaders = dist.new_group([h * LOCAL for h in range(HOSTS)])
    host = rank // LOCAL
    return PassingAllreduce(first, f"h{host + 1}", groups[host], rto=0.05,
                            params_source=lambda: JobParams.load(path), poll=0.05,
                            hosts_group=leaders, **options)


def worker(rank: int, port: int, first: JobParams, path: str, until: int,
           out: mp.Queue) -> None:
    try:
        import torch
        import torch.distributed as dist

        passing = polling_allreduce(rank, port, first, path)
        # Taken at the start, as passing-agent does: it must count the whole run.
        stats = passing.streamer.stats if passing.stream is not None else None
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
            if rank == 0:  # how far the run is, for the test's controller thread
                Path(f"{path}.calls").write_text(str(calls))
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
            report.update(moves=passing.stream.vote.moves, window=cfg.window, pool=cfg.pool,
                          results=stats.results, same_stats=stats is passing.streamer.stats,
                          host_calls=passing.stream.host_calls)
        passing.close()
        dist.destroy_process_group()
        out.put(report)
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


def pool_contribs(sw: UdpLoopbackSwitch, pool: int) -> list[int]:
    cells = sw.pipe.state.counters["pool_contribs"]
    return [cells[pool * P.MAX_FAN_IN + c][0] for c in range(HOSTS)]


def ranks_beside(control, sw: UdpLoopbackSwitch, target, args_of, join: float) -> dict:
    """Every rank's report of `target` (run_ranks; args_of(rank, port)), with `control` (what
    the controller does meanwhile: install pools, rewrite the parameters file) in a thread;
    the switch closed after. Fails on an error of `control` and on any wrong sum."""
    errors = []

    def guarded() -> None:
        try:
            control()
        except Exception:
            errors.append(traceback.format_exc())

    thread = threading.Thread(target=guarded)
    thread.start()
    try:
        port = free_port()
        results = run_ranks(target, WORLD, lambda r: args_of(r, port), timeout=240)
    finally:
        thread.join(join)
        sw.close()
    assert not errors, errors[0]
    for r in range(WORLD):
        assert results[r]["wrong"] == [], f"rank {r}: wrong sums in calls {results[r]['wrong']}"
    return results


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

    def wait_all_on(pool: int) -> None:
        deadline = time.monotonic() + 60
        while min(pool_contribs(sw, pool)) == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"hosts never all used pool {pool}")
            time.sleep(0.05)

    def resize() -> None:
        wait_all_on(0)  # the job runs in its first pool
        time.sleep(0.3)
        job = sw.entries.job
        one = dataclasses.replace(job, pool=1, epoch=1, pool_base=100, pool_size=3, gen=2)
        conn.write([adm.job_update(Update.INSERT, one)])
        path.write_text(json.dumps(dataclasses.replace(first, window=3, pool=1).to_dict()))
        wait_all_on(1)
        conn.write([adm.job_delete(job.job_id, 0)])
        # Counters of the pool a resize reuses start at zero, as the controller leaves them.
        for c in range(HOSTS):
            sw.pipe.state.counters["pool_contribs"][c] = [0, 0]
        two = dataclasses.replace(job, pool=0, epoch=2, pool_base=200, pool_size=12, gen=3)
        conn.write([adm.job_update(Update.INSERT, two)])
        path.write_text(json.dumps(dataclasses.replace(first, window=12,
                                                       pool=2).to_dict()))
        wait_all_on(0)
        conn.write([adm.job_delete(job.job_id, 1)])

    results = ranks_beside(resize, sw, worker, lambda r, port: (r, port, first, str(path), 2),
                           join=70)
    leaders = [results[h * LOCAL] for h in range(HOSTS)]
    assert all(len(x["moves"]) == 2 for x in leaders), leaders
    assert leaders[0]["moves"] == leaders[1]["moves"], "the hosts moved after different calls"
    assert [(p, w) for _, p, w in leaders[0]["moves"]] == [(1, 3), (2, 12)]
    assert all((x["window"], x["pool"]) == (12, 2) for x in leaders)
    # Counters go on across pools: each call brings at least its 4 fragments' results.
    assert all(x["same_stats"] and x["results"] >= 4 * x["calls"] for x in leaders), leaders


def test_a_job_waiting_for_slots_sums_over_its_hosts_then_moves_onto_the_switch(tmp_path):
    """A job created while its switch had no room (window 0, no job_config entry): its hosts
    sum with the host collective over their leaders' group, every call exact; the controller
    then installs its first pool (epoch 1) and rewrites the parameters, and every host moves
    onto the switch after the same call, every call still exact."""
    sw = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=8)
    conn = InProcessConnection(sw.service)
    adm = JobAdmissionTables(conn)
    job = sw.entries.job
    conn.write([adm.job_delete(job.job_id, 0)])  # the switch holds no pool for the job
    first = dataclasses.replace(sw.agent_params(), window=0)
    path = tmp_path / "job.json"
    path.write_text(first.to_json())

    def place() -> None:
        progress = Path(f"{path}.calls")
        deadline = time.monotonic() + 120
        while not progress.exists() or int(progress.read_text() or 0) < 5:
            assert time.monotonic() < deadline, "the hosts never summed 5 calls"
            time.sleep(0.05)  # calls over the host collective meanwhile
        assert pool_contribs(sw, 0) == [0, 0]  # nothing reached the switch
        one = dataclasses.replace(job, pool=1, epoch=1, pool_base=100, pool_size=4, gen=2)
        conn.write([adm.job_update(Update.INSERT, one)])
        path.write_text(json.dumps(dataclasses.replace(first, window=4, pool=1).to_dict()))
        deadline = time.monotonic() + 60
        while min(pool_contribs(sw, 1)) == 0:
            assert time.monotonic() < deadline, "the hosts never used the switch"
            time.sleep(0.05)

    results = ranks_beside(place, sw, worker, lambda r, port: (r, port, first, str(path), 1),
                           join=70)
    leaders = [results[h * LOCAL] for h in range(HOSTS)]
    assert leaders[0]["moves"] == leaders[1]["moves"], "the hosts moved after different calls"
    [(call, pool, window)] = leaders[0]["moves"]
    assert (pool, window) == (1, 4) and all(x["host_calls"] == call for x in leaders), leaders
    assert call >= 5, leaders  # summed without the switch for a while first
    assert all((x["window"], x["pool"]) == (4, 1) for x in leaders)
    # After the move every call went through the switch: results for each of its fragments.
    assert all(x["results"] >= 4 * (x["calls"] - call) for x in leaders), leaders


# -- a live policy change: real processes, a straggler -----------------------------------------
LATE = 0.3  # how late h2 is for every call while the hosts may close rounds without it


def policy_worker(rank: int, port: int, first: JobParams, path: str, out: mp.Queue) -> None:
    try:
        import torch
        import torch.distributed as dist

        from host_agent.backend_checks import live_policy

        passing = polling_allreduce(rank, port, first, path, policy=live_policy({}))
        host = rank // LOCAL
        base = torch.arange(N, dtype=torch.float32) % 97
        calls, shorts, modes, wrong, differ, after_last = 0, [], [], [], [], 0
        flag = torch.zeros(1)
        while True:
            # h2 is the straggler, but only while the policy lets the others go on without it:
            # every local rank learns that from its leader after the call that changed it.
            if host == 1 and passing.quorum_mode:
                time.sleep(LATE)
            modes.append(passing.quorum_mode)
            t = base * (rank + 1) + calls
            passing.allreduce(t)
            # A round with every host, or one closed with h1's two GPUs and scaled to the
            # four it stands for (PassingAllreduce): nothing else, element by element.
            full = base * sum(range(1, WORLD + 1)) + WORLD * calls
            h1_only = (base * (1 + 2) + 2 * calls) * 2
            if not torch.all((t == full) | (t == h1_only)):
                wrong.append(calls)
            everyone = [torch.zeros_like(t) for _ in range(WORLD)]
            dist.all_gather(everyone, t)
            if not all(torch.equal(x, everyone[0]) for x in everyone):
                differ.append(calls)
            if passing.stream is not None:
                shorts.append(bool(np.any(passing.stream.last_counts < WORLD)))
            calls += 1
            flag[0] = passing.stream.vote.params.policy if passing.stream is not None else 0
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            after_last = after_last + 1 if int(flag[0]) >= 3 else 0
            if after_last > 5 or calls > 400:
                break
        report = {"rank": rank, "wrong": wrong, "differ": differ, "calls": calls,
                  "modes": modes}
        if passing.stream is not None:
            cfg = passing.streamer.cfg
            report.update(shorts=shorts, policies=passing.stream.vote.policies,
                          moves=passing.stream.vote.moves, patience=cfg.patience,
                          staleness=cfg.staleness)
        passing.close()
        dist.destroy_process_group()
        out.put(report)
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


def runs_of(flags: list[bool]) -> list[int]:
    """Lengths of the runs of True in `flags`."""
    runs, n = [], 0
    for f in [*flags, False]:
        if f:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_a_live_policy_change_applies_on_every_host_after_the_same_call(tmp_path):
    """A bulk-synchronous job (no patience) gets patience 0.05 s and staleness 2 while it runs,
    then staleness 0, then no patience again; the switch's quorum is 1 of 2 throughout, and h2
    is 0.3 s late for every call while the hosts may leave it out. Both hosts change after the
    same calls, every rank then knows whether it may be left out, the staleness bound holds
    (2 calls in a row without h2, never 3), and with staleness 0 or without patience no call
    leaves it out. Every result is a full sum or h1's scaled, the same on every rank."""
    sw = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=8,
                           quorum=1)
    first = sw.agent_params(local_gpus=LOCAL)
    path = tmp_path / "job.json"
    path.write_text(first.to_json())

    def change() -> None:
        deadline = time.monotonic() + 60
        while min(pool_contribs(sw, 0)) < 40:  # some bulk-synchronous calls first
            if time.monotonic() > deadline:
                raise AssertionError("the hosts never started summing")
            time.sleep(0.05)
        quorum = dataclasses.replace(first, patience=(0.05,), staleness=2, policy=1)
        path.write_text(quorum.to_json())
        while sw.pipe.state.counters["job_stats"][P.JobEvent.CLOSED_ROOT][0] < 12:
            if time.monotonic() > deadline + 60:
                raise AssertionError("no round was ever closed without h2")
            time.sleep(0.05)
        path.write_text(dataclasses.replace(quorum, staleness=0, policy=2).to_json())
        # Once no round has closed without h2 for a while (policy 2 is in force), back
        # to waiting for everyone. Were it written earlier, the hosts would go from 1 to 3
        # directly (a host votes for the newest it holds); the checks below allow that.
        closed, quiet = -1, time.monotonic()
        while time.monotonic() - quiet < 1.5:
            now = sw.pipe.state.counters["job_stats"][P.JobEvent.CLOSED_ROOT][0]
            if now != closed:
                closed, quiet = now, time.monotonic()
            time.sleep(0.05)
        path.write_text(dataclasses.replace(quorum, patience=(), policy=3).to_json())

    results = ranks_beside(change, sw, policy_worker, lambda r, port: (r, port, first, str(path)),
                           join=130)
    for r in range(WORLD):
        assert results[r]["differ"] == [], f"rank {r}: hosts differ in {results[r]['differ']}"
    h1, h2 = results[0], results[LOCAL]
    assert h1["policies"] == h2["policies"], "the hosts changed after different calls"
    assert h1["moves"] == [] and h1["policies"][-1][1] == 3, h1["policies"]
    at = dict((p, c) for c, p in h1["policies"])  # policy -> the first call under it
    assert at[1] > 0 and list(at) in ([1, 2, 3], [1, 3]), h1["policies"]
    end = h1["calls"]
    assert h1["patience"] is None and h2["patience"] is None  # policy 3: wait for everyone
    # Every local rank knew, from the call after each change on, whether it may be left out.
    for r in range(WORLD):
        assert results[r]["modes"] == [at[1] <= i < at[3] for i in range(end)], r
    assert h1["shorts"] == h2["shorts"]
    shorts = h1["shorts"]
    quorum_calls = shorts[at[1]:at.get(2, at[3])]
    assert not any(shorts[:at[1]]), "a call left a host out before any patience was set"
    assert 2 in runs_of(quorum_calls), f"staleness 2 never let 2 calls leave h2 out: {shorts}"
    assert max(runs_of(quorum_calls)) <= 2, f"staleness 2 broken: {quorum_calls}"
    assert not any(shorts[at.get(2, at[3]):]), f"staleness 0 / no patience broken: {shorts}"
