"""The model switch's tables and multicast groups as the arrays the compiled path reads
(switch_model/fastpath.h's row layouts): copied whenever the control plane changed them.

A table holding an entry of an action the compiled path does not know, a multicast group wider
than it copies, or a value no P4 field holds (only an in-process writer can make one) raises
Unsupported: the switch then takes every frame through the Python pipeline until the next
change."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from switch_model.state import Action, SwitchState

MAX_COPIES = 64  # the most replicas of a multicast group the compiled path copies to
JOB_COLUMNS = ("stat_idx", "is_root", "uplink_port", "epoch", "pool_size", "pool_base", "gen",
               "fan_in", "quorum", "mcast_grp")
MEMBER_COLUMNS = ("contributor", "count")
PEER_COLUMNS = ("src_ip", "dst_ip", "src_mac", "dst_mac", "dst_port", "contributor")
# l2_forward's actions as fastpath.h's L2_* kinds.
L2_DROP, L2_TO_PORT, L2_FLOOD = 0, 1, 2


class Unsupported(Exception):
    pass


@dataclass
class TableArrays:
    """Rows of uint64, one array per table (kept alive while the compiled path reads them)."""

    jobs: np.ndarray
    members: np.ndarray
    peers: np.ndarray
    replicas: np.ndarray
    l2: np.ndarray  # (dst MAC, kind, port or group), sorted by MAC
    guards: np.ndarray  # (UDP port, stat_idx)
    l2_default: tuple[int, int]  # (kind, port or group) on a miss
    widest: int  # the most replicas of one group (at least 1)


def _only(action: Action, name: str) -> bool:
    if action.name != name:
        raise Unsupported(action.name)
    return True


def _l2(action: Action) -> tuple[int, int]:
    if action.name == "l2_to_port":
        return L2_TO_PORT, action.params["port"]
    if action.name == "l2_flood":
        return L2_FLOOD, action.params["mcast_grp"]
    _only(action, "l2_drop")
    return L2_DROP, 0


def _rows(rows: list[tuple], cols: int) -> np.ndarray:
    return np.array(rows, dtype=np.uint64).reshape(len(rows), cols)


def table_arrays(st: SwitchState) -> TableArrays:
    """The arrays of `st`'s tables now; Unsupported (or OverflowError, ValueError, TypeError
    from numpy for a value out of range) where the compiled path cannot take them."""
    t = st.tables
    jobs = [(job, pool, *(a.params[c] for c in JOB_COLUMNS))
            for (job, pool), a in t["job_config"].entries.items() if _only(a, "set_job")]
    members = [(job, port, *(a.params[c] for c in MEMBER_COLUMNS))
               for (job, port), a in t["membership"].entries.items()
               if _only(a, "set_member")]
    peers = [(job, port, rid, *(a.params[c] for c in PEER_COLUMNS))
             for (job, port, rid), a in t["peer_rewrite"].entries.items()
             if _only(a, "set_peer")]
    groups = list(st.mcast.items())
    replicas = [(g, port, rid) for g, reps in groups for port, rid in reps]
    widest = max((len(reps) for _, reps in groups), default=1)
    if widest > MAX_COPIES:
        raise Unsupported(f"a multicast group of {widest} replicas")
    l2 = sorted((mac, *_l2(a)) for (mac,), a in t["l2_forward"].entries.items())
    guards = [(port, a.params["stat_idx"]) for (port,), a in t["result_guard"].entries.items()
              if _only(a, "guard_port")]
    return TableArrays(_rows(jobs, 12), _rows(members, 4), _rows(peers, 9), _rows(replicas, 3),
                       _rows(l2, 3), _rows(guards, 2), _l2(t["l2_forward"].default),
                       max(widest, 1))
