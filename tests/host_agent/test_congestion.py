"""The congestion window and the send gate (host_agent.congestion), without I/O: how the window
answers marks and losses, that two jobs sharing a link end up with equal windows whatever
pools they started from, and that hosts whose windows differ never deadlock on each other's
held packets."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent.congestion import MIN_WINDOW, CongestionWindow, SendGate


def _windows(w: CongestionWindow, n: int, marked_frac: float = 0.0) -> None:
    """`n` windows of results, each with `marked_frac` of them marked."""
    for _ in range(n):
        size = w.allowed
        w.on_results(size, int(round(size * marked_frac)))


def test_starts_at_the_pool_and_never_grows_past_it():
    w = CongestionWindow(64)
    assert w.allowed == 64
    _windows(w, 50)
    assert w.allowed == 64 and w.cuts == 0


def test_a_stray_mark_costs_little_persistent_marks_halve():
    w = CongestionWindow(256)
    _windows(w, 1, marked_frac=1.0)  # alpha 1/16: a cut of 1/32
    assert w.allowed == 248 and w.cuts == 1
    _windows(w, 10)
    assert w.allowed == 256
    _windows(w, 60, marked_frac=1.0)  # alpha near 1: each window halves
    assert w.alpha > 0.97 and w.allowed == MIN_WINDOW
    w.cwnd = 100.0
    _windows(w, 1, marked_frac=1.0)
    assert w.allowed == 50
    _windows(w, 10)
    assert w.allowed == 60


def test_few_marks_cut_little_once_alpha_has_learned_them():
    w = CongestionWindow(256)
    i = 0
    while i < 20000 or w._acked:  # one result in twenty marked, up to a window's end
        w.on_results(1, int(i % 20 == 0))
        i += 1
    assert w.alpha == pytest.approx(0.05, abs=0.02)
    before, alpha = w.cwnd, w.alpha
    size = w.allowed
    w.on_results(size, 1)
    learned = (1 - w.gain) * alpha + w.gain / size
    assert w.alpha == pytest.approx(learned)
    assert w.cwnd == pytest.approx(max(before * (1 - learned / 2), MIN_WINDOW))
    assert w.cwnd > before * 0.9  # a cut of a few percent, not TCP's half


def test_a_loss_halves_once_per_window_of_results_and_stops_growth():
    w = CongestionWindow(100)
    w.on_loss()
    w.on_loss()
    w.on_loss()
    assert w.allowed == 50 and w.cuts == 1
    w.on_results(50, 0)  # the window that saw the loss ends: no growth
    assert w.allowed == 50
    w.on_loss()
    assert w.allowed == 25


def test_the_window_stays_inside_its_floor():
    w = CongestionWindow(8)
    for _ in range(20):
        w.on_loss()
        w.on_results(w.allowed, 0)
    assert w.allowed == MIN_WINDOW
    assert CongestionWindow(1).allowed == 1  # a pool of one slot is its own floor
    with pytest.raises(ValueError, match="at least 1"):
        CongestionWindow(0)


@pytest.mark.parametrize("pools", [(256, 32), (32, 256), (128, 128), (256, 40)])
def test_two_jobs_on_one_link_converge_to_equal_windows(pools):
    """A link that holds `cap` packets in flight: when the jobs' windows together exceed it,
    the switch marks both jobs' results (its queue is shared), in proportion to the excess.
    AIMD moves the two windows to the same value whatever each job's pool."""
    cap = 60
    a, b = CongestionWindow(pools[0]), CongestionWindow(pools[1])
    shares = []
    for step in range(3000):
        over = a.allowed + b.allowed - cap
        frac = min(1.0, max(0.0, over / cap))
        for w in (a, b):
            size = w.allowed
            w.on_results(size, int(np.ceil(size * frac)))
        if step >= 2000:
            shares.append(a.allowed / (a.allowed + b.allowed))
    mean = float(np.mean(shares))
    assert 0.45 <= mean <= 0.55, (pools, mean)
    assert a.allowed + b.allowed <= 2 * cap  # and they do not overrun the link by far


def test_the_gate_passes_everything_while_the_window_has_room():
    g = SendGate()
    ready = np.array([5, 2, 7], dtype=np.int64)
    out = g.admit(ready, ready, in_flight=3, allowed=8, earliest_in_flight=0)
    assert out.tolist() == [5, 2, 7] and g.holding == 0


def test_held_slots_go_in_packet_order_as_room_opens():
    g = SendGate()
    ready = np.array([9, 4, 6, 1], dtype=np.int64)
    keys = ready + 100
    assert g.admit(ready, keys, in_flight=2, allowed=4, earliest_in_flight=50).tolist() == [1, 4]
    assert g.holding == 2
    empty = np.zeros(0, dtype=np.int64)
    assert g.admit(empty, empty, in_flight=4, allowed=4, earliest_in_flight=50).tolist() == []
    assert g.admit(empty, empty, in_flight=3, allowed=4, earliest_in_flight=50).tolist() == [6]
    # The earliest packet of all goes even with the window full.
    late = np.array([0], dtype=np.int64)
    assert g.admit(late, late, in_flight=9, allowed=4,
                   earliest_in_flight=101).tolist() == [0]


def _call_with_two_hosts(windows: tuple[int, int], used: int, steps: int,
                         late: set[int], cut_at: int | None = None) -> int:
    """A call of `used` slots x `steps` packets each, on two hosts with windows `windows` (from
    pass `cut_at` on, if given, both windows 1: marks cut them while packets are out); a
    packet's round completes once both hosts sent it, and its result reaches both a pass
    later, except that host 0 hears of the rounds in `late` (by packet key) five passes later
    (a lost result, recovered). Returns the passes the call took; fails on a deadlock (no
    host can send, nothing is on its way, and packets remain)."""
    gates = (SendGate(), SendGate())
    step = np.zeros((2, used), dtype=np.int64)  # each slot's next (or waiting) packet
    pending = np.zeros((2, used), dtype=bool)
    ready = [np.arange(used, dtype=np.int64) for _ in range(2)]
    sent_by: dict[int, int] = {}
    arriving: list[tuple[int, int, int]] = []  # (pass due, host, slot)
    finished, total = 0, used * steps
    for now in range(1, 50 * total):
        for h in (0, 1):
            keys = step[h, ready[h]] * used + ready[h]
            waiting = np.flatnonzero(pending[h])
            earliest = int((step[h, waiting] * used + waiting).min()) if waiting.size else None
            allowed = 1 if cut_at is not None and now >= cut_at else windows[h]
            go = gates[h].admit(ready[h], keys, waiting.size, allowed, earliest)
            ready[h] = np.zeros(0, dtype=np.int64)
            for s in go.tolist():
                pending[h, s] = True
                key = int(step[h, s]) * used + s
                sent_by[key] = sent_by.get(key, 0) + 1
                if sent_by[key] == 2:
                    finished += 1
                    arriving.append((now + (5 if key in late else 1), 0, s))
                    arriving.append((now + 1, 1, s))
        due = [a for a in arriving if a[0] <= now]
        arriving = [a for a in arriving if a[0] > now]
        for _, h, s in due:
            pending[h, s] = False
            step[h, s] += 1
            if step[h, s] < steps:
                ready[h] = np.append(ready[h], s)
        if finished == total and not arriving:
            return now
        if not arriving and not any(r.size for r in ready) and not due:
            raise AssertionError(f"deadlock: {finished} of {total} rounds done, windows "
                                 f"{windows}, held {[g.holding for g in gates]}")
    raise AssertionError("no end")


@pytest.mark.parametrize("windows", [(1, 8), (2, 3), (8, 1), (5, 5), (3, 7)])
@pytest.mark.parametrize("cut_at", [None, 3, 6])
def test_hosts_with_different_windows_finish_the_call(windows, cut_at):
    assert _call_with_two_hosts(windows, used=8, steps=6, late={3, 12, 13, 30},
                                cut_at=cut_at) > 0
