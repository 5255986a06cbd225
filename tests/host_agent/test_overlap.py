"""The background calls of the `passing` backend (host_agent.overlap), alone: order, errors
where the Work is waited on (the call's own type) and in its future (what DDP reads), draining,
closing, and the synchronous mode of PASSING_OVERLAP=0."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from host_agent.allreduce import AllreduceError
from host_agent.overlap import CallQueue, overlap_enabled


def test_calls_run_in_order_after_the_caller_returned():
    q = CallQueue("test-calls")
    gate, ran = threading.Event(), []

    def call(i: int):
        def run() -> None:
            gate.wait(5)
            ran.append(i)
        return run
    works = [q.submit(call(i), [torch.ones(1) * i]) for i in range(5)]
    assert ran == [] and not any(w.is_completed() for w in works)  # returned before running
    gate.set()
    assert [w.get_future().wait()[0].item() for w in works] == [0, 1, 2, 3, 4]
    assert ran == [0, 1, 2, 3, 4] and all(w.wait() and w.is_completed() for w in works)
    q.close()


def test_an_error_is_raised_at_wait_as_itself_and_fails_the_future():
    q = CallQueue("test-errors")

    def fail() -> None:
        raise AllreduceError("the switch did not answer")
    bad = q.submit(fail, [torch.ones(1)])
    good = q.submit(lambda: None, [torch.ones(1)])  # later calls still run
    with pytest.raises(AllreduceError, match="did not answer"):
        bad.wait()
    # What DDP reads: a future that fails (not one whose value is the exception object).
    with pytest.raises(RuntimeError, match="AllreduceError: the switch did not answer"):
        bad.get_future().wait()
    assert good.wait() and not bad.is_success()
    q.close()


def test_drain_waits_for_the_calls_in_flight_and_close_refuses_more():
    q = CallQueue("test-drain")
    done = []
    q.submit(lambda: (time.sleep(0.2), done.append(1)), [])
    q.drain()
    assert done == [1]
    q.close()
    with pytest.raises(RuntimeError, match="closed"):
        q.submit(lambda: None, [])


def test_without_overlap_a_call_runs_and_raises_in_the_callers_thread():
    q = CallQueue("test-sync", background=False)
    where = []
    work = q.submit(lambda: where.append(threading.current_thread()), [torch.ones(1)])
    assert work.is_completed() and where == [threading.current_thread()]
    with pytest.raises(AllreduceError):
        q.submit(lambda: (_ for _ in ()).throw(AllreduceError("x")), [])


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), (" 1 ", True)])
def test_passing_overlap_is_read(value, on):
    assert overlap_enabled({"PASSING_OVERLAP": value}) is on
    assert overlap_enabled({}) is True


def test_a_bad_passing_overlap_is_refused_naming_it():
    with pytest.raises(ValueError, match="PASSING_OVERLAP='yes': 1 .* or 0"):
        overlap_enabled({"PASSING_OVERLAP": "yes"})
