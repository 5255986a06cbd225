"""The egress's fair-share mark (docs/protocol.md, "Fair shares of a port"), without I/O: a job
that takes more than its share of a port whose queue stands has the excess fraction of its
packets marked, and only then; a lone job, a short queue, a job within its share are never
marked; ordinary traffic counts as one more flow. The compiled loop's step (fastpath_fair.c)
gives the same marks and leaves the same counters as the Python one on any sequence."""

from __future__ import annotations

import numpy as np
import pytest

from passing import cbuild
from passing import protocol as P
from switch_model import fastpath
from switch_model.fair_share import OTHER_FLOW, P_ACTIVE, P_F, FairShare

FRAME = P.FRAME_BYTES
PORT, A, B = 3, 5, 9


def run(fs: FairShare, pattern: list[int], intervals: int, per_interval: int, deep: bool,
        start: int = 1000, passing=lambda flow: flow != OTHER_FLOW) -> dict[int, list[bool]]:
    """Packets of the flows in `pattern`, repeated, `per_interval` per interval: each flow's
    marks in order."""
    marks: dict[int, list[bool]] = {f: [] for f in set(pattern)}
    n = 0
    for e in range(start, start + intervals):
        for _ in range(per_interval):
            flow = pattern[n % len(pattern)]
            n += 1
            marks[flow].append(fs.step(PORT, flow, FRAME, e, deep, passing(flow)))
    return marks


def test_a_lone_job_is_never_marked_however_deep_its_queue():
    marks = run(FairShare(), [A], intervals=50, per_interval=40, deep=True)
    assert not any(marks[A])


def test_two_jobs_at_two_to_one_the_larger_loses_its_excess_the_smaller_nothing():
    fs = FairShare()
    marks = run(fs, [A, A, B], intervals=200, per_interval=60, deep=True)
    # A standing queue at every interval's start drives f to its floor (fair = 1/2 each): A,
    # at 2/3 of the port, has 1 - (1/2)/(2/3) = 1/4 of its packets marked, spread evenly.
    assert int(fs.ports[PORT][P_F]) == P.FAIR_F_MIN
    steady = marks[A][len(marks[A]) // 2:]
    assert sum(steady) / len(steady) == pytest.approx(0.25, abs=0.005)
    assert max(len(run_) for run_ in "".join("x" if m else "." for m in steady).split(".")) == 1
    assert not any(marks[B])
    assert int(fs.ports[PORT][P_ACTIVE]) == 2


def test_a_short_queue_marks_no_one_and_lets_the_share_grow():
    fs = FairShare()
    marks = run(fs, [A, A, A, B], intervals=30, per_interval=40, deep=False)
    assert not any(marks[A]) and not any(marks[B])
    assert int(fs.ports[PORT][P_F]) == P.FAIR_F_MAX


def test_ordinary_traffic_is_one_more_flow_and_is_never_marked():
    # TCP beside a job: the job, at 2/3 of the port, is marked; TCP at 1/3 holds its share
    # (its frames are never marked: the mark is PASSING's).
    fs = FairShare()
    marks = run(fs, [A, A, OTHER_FLOW], intervals=100, per_interval=60, deep=True)
    assert sum(marks[A]) > 0.2 * len(marks[A]) and not any(marks[OTHER_FLOW])
    # The job at 1/3 beside TCP at 2/3: within its share, unmarked.
    fs = FairShare()
    marks = run(fs, [A, OTHER_FLOW, OTHER_FLOW], intervals=100, per_interval=60, deep=True)
    assert not any(marks[A])


def test_a_flow_under_a_twentieth_of_the_port_does_not_halve_the_others_share():
    # B at 1/40 is not active: A alone is, and a lone active flow is never marked (after the
    # first interval, in which every flow that sends counts: the port carried nothing before).
    fs = FairShare()
    marks = run(fs, [A] * 39 + [B], intervals=40, per_interval=80, deep=True)
    assert not any(marks[A][2 * 78:]) and not any(marks[B])


def test_counts_of_an_interval_not_the_last_are_forgotten():
    fs = FairShare()
    run(fs, [A, A, B], intervals=20, per_interval=60, deep=True)
    # Ten intervals of silence: what A sent before says nothing of now.
    marks = run(fs, [A, A, B], intervals=1, per_interval=60, deep=True, start=1030)
    assert not any(marks[A])


@pytest.fixture(scope="module")
def dll():
    if cbuild.compiler() is None:
        pytest.skip("no C compiler (cc or gcc) to build the compiled path")
    return fastpath._open(fastpath.build())


def test_the_compiled_step_marks_and_counts_as_the_python_one(dll):
    rng = np.random.default_rng(47)
    py, c = FairShare(), FairShare()
    epoch, got_py, got_c = 5, [], []
    for _ in range(20000):
        epoch += int(rng.choice([0] * 40 + [1, 1, 2]))
        port = int(rng.choice([0, 1, PORT, P.FAIR_PORTS - 1]))
        flow = int(rng.choice([A, B, 0, OTHER_FLOW, A, A]))
        nbytes = int(rng.choice([64, 1500, FRAME, FRAME]))
        deep = bool(rng.random() < 0.8)
        passing = flow != OTHER_FLOW or bool(rng.random() < 0.1)
        got_py.append(py.step(port, flow, nbytes, epoch, deep, passing))
        got_c.append(bool(dll.fp_fair_step(c.ports.ctypes.data, c.flows.ctypes.data, port,
                                           flow, nbytes, epoch, int(deep), int(passing))))
    assert got_py == got_c and 100 < sum(got_py) < 10000
    assert np.array_equal(py.ports, c.ports) and np.array_equal(py.flows, c.flows)
