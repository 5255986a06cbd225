"""The fair-share mark of the model switch's egress (docs/protocol.md, "Fair shares of a port"):
the P4 program's FairShare control, step for step in integers, for the Python port loop. The
compiled port loop runs the same step in C (fastpath_fair.c) on the same arrays; the unit tests
hold the two to one sequence of marks.

A port's state: [epoch, bytes this interval, bytes last interval, f in 1/16ths, flows active
last interval, flows active so far this interval]; a flow's (port x flow): [epoch, bytes this
interval, bytes last interval, mark accumulator]."""

from __future__ import annotations

import time

import numpy as np

from passing import protocol as P
from switch_model.frame import FLAGS_AT_BYTE

P_EPOCH, P_CUR, P_PREV, P_F, P_ACTIVE, P_ACTIVE_NEXT, P_COLS = range(7)
F_EPOCH, F_CUR, F_PREV, F_ACC, F_COLS = range(5)
OTHER_FLOW = P.FAIR_FLOWS - 1  # every frame that is not a PASSING copy of a known job
EPOCH_MASK = 0xFFFFFFFF  # the P4 registers' width


def epoch_now() -> int:
    """The current interval's number: what the P4 program takes from egress_global_timestamp
    (microseconds), here from the monotonic clock the C loop reads too."""
    return ((time.monotonic_ns() // 1000) >> P.FAIR_INTERVAL_SHIFT) & EPOCH_MASK


class FairShare:
    """One switch's counters; `step` is FairShare.apply for one packet leaving a port."""

    def __init__(self) -> None:
        self.ports = np.zeros((P.FAIR_PORTS, P_COLS), dtype=np.uint64)
        self.flows = np.zeros((P.FAIR_PORTS * P.FAIR_FLOWS, F_COLS), dtype=np.uint64)

    def reset(self) -> None:
        """A new pipeline pushed: its registers start at zero."""
        self.ports.fill(0)
        self.flows.fill(0)

    def step(self, port: int, flow: int, nbytes: int, epoch: int, deep: bool,
             passing: bool) -> bool:
        """Count `nbytes` of `flow` out of `port` in interval `epoch`, the queue `deep` (at
        least FAIR_QDEPTH packets); True if this packet (a PASSING copy) is to be marked."""
        if port >= P.FAIR_PORTS:
            return False
        p = self.ports[port]
        if int(p[P_EPOCH]) != epoch:
            last = (int(p[P_EPOCH]) + 1) & EPOCH_MASK == epoch
            p[P_PREV] = p[P_CUR] if last else 0
            p[P_ACTIVE] = p[P_ACTIVE_NEXT] if last else 0
            p[P_CUR] = 0
            p[P_ACTIVE_NEXT] = 0
            f = max(int(p[P_F]), P.FAIR_F_MIN)
            # The loop that finds the fair share: a queue that stands at an interval's start
            # means the shares let through too much.
            p[P_F] = max(P.FAIR_F_MIN, f - (f >> 2)) if deep else min(P.FAIR_F_MAX, f + (f >> 2))
            p[P_EPOCH] = epoch
        fl = self.flows[port * P.FAIR_FLOWS + flow]
        if int(fl[F_EPOCH]) != epoch:
            fl[F_PREV] = fl[F_CUR] if (int(fl[F_EPOCH]) + 1) & EPOCH_MASK == epoch else 0
            fl[F_CUR] = 0
            fl[F_EPOCH] = epoch
        mark = False
        prev, port_prev = int(fl[F_PREV]), int(p[P_PREV])
        if passing and deep and p[P_ACTIVE] >= 2 and prev:
            # Marked with probability 1 - fair / rate, spread evenly: the accumulator gains
            # the excess (rate - fair, both times active x 16) per packet and a mark spends
            # one whole rate.
            rate = int(p[P_ACTIVE]) * prev * 16
            fair = port_prev * int(p[P_F])
            if rate > fair:
                acc = int(fl[F_ACC]) + rate - fair
                if acc >= rate:
                    mark = True
                    acc -= rate
                    if acc >= rate:
                        acc = 0
                fl[F_ACC] = acc
        # Active this interval: the flow's bytes reach 1/FAIR_ACTIVE_DIV of what the port
        # carried last interval (counted once, as they first do).
        old = int(fl[F_CUR])
        if (old == 0 or old * P.FAIR_ACTIVE_DIV < port_prev) \
                and (old + nbytes) * P.FAIR_ACTIVE_DIV >= port_prev:
            p[P_ACTIVE_NEXT] += 1
        fl[F_CUR] = old + nbytes
        p[P_CUR] += nbytes
        return mark


def fair_flow(state, frame: bytes, passing: bool) -> int:
    """The flow a frame leaving the switch counts in: its job's stat row (job_config's
    stat_idx, what the P4 program carries to egress) for a PASSING copy of a known job, else
    OTHER_FLOW. `state` is the switch's SwitchState."""
    if not passing:
        return OTHER_FLOW
    job_id = int.from_bytes(frame[FLAGS_AT_BYTE - 5:FLAGS_AT_BYTE - 3], "big")
    pool = (frame[FLAGS_AT_BYTE] & int(P.Flag.POOL)) >> 4
    entry = state.tables["job_config"].entries.get((job_id, pool))
    if entry is None:
        return OTHER_FLOW
    stat = int(entry.params["stat_idx"])
    return stat if stat < OTHER_FLOW else OTHER_FLOW
