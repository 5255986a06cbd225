"""Sessions on every target (docs/protocol.md, "Sessions"): real host agents' window protocol
(host_agent.stream) on the switch's test ports, one thread per host. No session ever receives a
value of another session: across successive sessions, after a timeout, when one host's agent
restarts alone and when the switch restarts mid-job. Every call of every host is checked."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from host_agent.session import new_session
from host_agent.stream import SessionBroken, SlotStreamer, StreamConfig, SwitchTimeout
from passing import protocol as P
from testbed.entries import PortTransport, install_job

DEV, JOB = 0, 3
DEADLINE = 3.0  # the agents' deadline: seconds without progress before SwitchTimeout


def streamers(sw, hosts: list[int], slots: int, session: int, **kw) -> list[SlotStreamer]:
    """One agent per host port; contributor ids are port - 1, `hosts` are all the job's."""
    n = len(hosts)
    return [SlotStreamer(StreamConfig(JOB, p - 1, slots, n, session, rto=0.05,
                                      deadline=kw.get("deadline", DEADLINE)),
                         PortTransport(sw.test_ports[p], DEV, p)) for p in hosts]


def int_tensors(seed: int, hosts: int, n: int) -> list[np.ndarray]:
    """Integer-valued float32 tensors: the switch's fixed point sums them exactly, so any
    value of another call or session shows as a difference."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, n).astype(np.float32) for _ in range(hosts)]


class Outcome:
    def __init__(self) -> None:
        self.results: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.error_at = 0.0


def run(agents: list[SlotStreamer], calls: list[list[np.ndarray]]) -> list[Outcome]:
    """Host i makes calls[c][i] for every c, until its first error."""
    out = [Outcome() for _ in agents]

    def work(i: int) -> None:
        try:
            for tensors in calls:
                out[i].results.append(agents[i].allreduce(tensors[i]))
        except Exception as e:  # asserted by the tests
            out[i].error, out[i].error_at = e, time.monotonic()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "an agent hung"
    return out


def assert_exact(outcomes: list[Outcome], calls: list[list[np.ndarray]]) -> None:
    """Every result any host got equals the exact sum of its call."""
    for h, o in enumerate(outcomes):
        for c, got in enumerate(o.results):
            exact = np.sum(calls[c], axis=0, dtype=np.float64)
            wrong = np.count_nonzero(got != exact)
            assert wrong == 0, f"host {h}, call {c}: {wrong} of {exact.size} values wrong"


# Slots W=4. Every call uses each slot once for the exponents and once per fragment it carries:
# 4 fragments -> 2 uses per slot (the session ends on version 1), 8 -> 3 (ends on version 0,
# complete, every bitmap bit set: what the next session's first packets find).
@pytest.mark.parametrize("uses", ["even", "odd"])
def test_a_new_session_never_sees_the_previous_one(star, uses):
    sw = star["s1"]
    hosts, slots = [1, 2, 3], 4
    n = (4 if uses == "even" else 8) * P.K
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    first = [int_tensors(1, 3, n)]
    out = run(streamers(sw, hosts, slots, new_session()), first)
    assert all(o.error is None for o in out)
    assert_exact(out, first)
    # The next session: every call is checked, the first one too, with other values.
    second = [int_tensors(seed, 3, n) for seed in (2, 3, 4)]
    out = run(streamers(sw, hosts, slots, new_session()), second)
    assert all(o.error is None and len(o.results) == 3 for o in out)
    assert_exact(out, second)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
def test_reusing_a_session_number_would_return_old_sums(star):
    """Why sessions must be new: a second run with the first run's number is exactly the
    stale-result bug, and the exact check above catches it."""
    sw = star["s1"]
    hosts, slots, n = [1, 2], 4, 8 * P.K
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    session = new_session()
    run(streamers(sw, hosts, slots, session), [int_tensors(1, 2, n)])
    again = [int_tensors(2, 2, n)]
    out = run(streamers(sw, hosts, slots, session), again)
    exact = np.sum(again[0], axis=0, dtype=np.float64)
    assert any(o.error is not None or np.any(o.results[0] != exact) for o in out)


def test_timeout_then_a_retry_on_the_same_job(star):
    sw = star["s1"]
    hosts, slots, n = [1, 2, 3], 8, 20 * P.K
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    calls = [int_tensors(5, 3, n)]
    # Host 3 never calls: the others time out, mid-stream, and their session is spent.
    agents = streamers(sw, hosts, slots, new_session())
    t0 = time.monotonic()
    out = run(agents[:2], calls)
    for o in out:
        assert isinstance(o.error, SwitchTimeout) and not o.results
        assert o.error_at - t0 < DEADLINE + 5
    with pytest.raises(SessionBroken, match="start a new session"):
        agents[0].allreduce(calls[0][0])
    # The retry is a new session of every host: correct from its first call on, although the
    # slots hold the failed session's partial sums.
    retry = [int_tensors(seed, 3, n) for seed in (6, 7)]
    out = run(streamers(sw, hosts, slots, new_session()), retry)
    assert all(o.error is None and len(o.results) == 2 for o in out)
    assert_exact(out, retry)


def test_one_agent_restarting_alone_fails_everyone_and_returns_no_wrong_value(star):
    sw = star["s1"]
    hosts, slots, n = [1, 2, 3], 4, 16 * P.K
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    calls = [int_tensors(10 + c, 3, n) for c in range(50)]
    old = streamers(sw, hosts, slots, new_session())
    # Host 3's agent makes two calls and dies; its replacement starts a session of its own
    # while hosts 1 and 2 are still in theirs (what an agent that cannot rendezvous with the
    # running hosts would do if it went ahead anyway).
    out = {}

    def first_two() -> None:
        out["old3"] = run([old[2]], [[c[2]] for c in calls[:2]])[0]

    def survivors() -> None:
        out["12"] = run(old[:2], calls)

    t_old = threading.Thread(target=first_two)
    t_run = threading.Thread(target=survivors)
    t_old.start()
    t_run.start()
    t_old.join(60)
    restarted = streamers(sw, hosts, slots, new_session())[2]
    died_at = time.monotonic()
    out["new3"] = run([restarted], [[c[2]] for c in calls])[0]
    t_run.join(120)
    assert out["old3"].error is None and len(out["old3"].results) == 2
    for o in (*out["12"], out["new3"]):
        assert isinstance(o.error, SwitchTimeout), o.error
        assert o.error_at - died_at < 2 * DEADLINE + 5
    assert_exact(out["12"], calls)
    assert_exact([out["old3"]], calls[:2])
    assert len(out["12"][0].results) >= 2
    assert not out["new3"].results


def test_switch_restart_mid_job_never_gives_a_wrong_value(star):
    """The switch process is killed during a stream and started again empty; the job is
    installed again (what the controller's reconcile does). Each host either completes its
    calls with the right sums or fails with a clear error; none gets a wrong value."""
    sw = star["s1"]
    hosts, slots, n = [1, 2, 3], 8, 64 * P.K
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    calls = [int_tensors(20 + c, 3, n) for c in range(6)]
    agents = streamers(sw, hosts, slots, new_session(), deadline=15.0)
    result: dict[str, list[Outcome]] = {}
    t = threading.Thread(target=lambda: result.setdefault("out", run(agents, calls)))
    t.start()
    time.sleep(0.5)
    star.restart("s1")
    install_job(star["s1"].conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    t.join(180)
    out = result["out"]
    for o in out:
        assert o.error is None or isinstance(o.error, SwitchTimeout | SessionBroken), o.error
    assert_exact(out, calls)
    # And a new session on the restarted switch is correct from its first call.
    again = [int_tensors(30, 3, n)]
    out = run(streamers(star["s1"], hosts, slots, new_session()), again)
    assert all(o.error is None for o in out)
    assert_exact(out, again)


def test_switch_down_fails_every_host_within_the_deadline(star):
    sw = star["s1"]
    hosts, slots, n = [1, 2], 4, 64 * P.K
    install_job(sw.conn, DEV, JOB, members={p: p - 1 for p in hosts}, pool_size=slots)
    calls = [int_tensors(40 + c, 2, n) for c in range(50)]
    agents = streamers(sw, hosts, slots, new_session())
    result: dict[str, list[Outcome]] = {}
    t = threading.Thread(target=lambda: result.setdefault("out", run(agents, calls)))
    t.start()
    time.sleep(0.5)
    star.restart("s1")  # back empty, and nobody installs the job again
    down_at = time.monotonic()
    t.join(120)
    for o in result["out"]:
        assert isinstance(o.error, SwitchTimeout)
        assert o.error_at - down_at < DEADLINE + 5
    assert_exact(result["out"], calls)
