"""What a rank of `passing-agent` reports beside its times: its stream's packet counts, its
leader's pool moves, and the bytes its host link carried per timed call."""

from __future__ import annotations


def pools_report(passing) -> dict:
    """The leader's pool moves ([call, pool, window] each) and the window it ended in; {} for
    the baselines."""
    stream = getattr(passing, "stream", None)
    if stream is None:
        return {}
    return {"pool_moves": [list(m) for m in stream.vote.moves],
            "window": stream.streamer.cfg.window, "host_calls": stream.host_calls}


def link_bytes(ifname: str | None) -> tuple[int, int] | None:
    """(tx, rx) bytes the host's data interface has carried so far, read where the ranks run
    (the host's namespace); None without an interface named."""
    if not ifname:
        return None
    try:
        return tuple(int(open(f"/sys/class/net/{ifname}/statistics/{d}_bytes").read())
                     for d in ("tx", "rx"))
    except (OSError, ValueError):
        return None


def timed_link_bytes(start: tuple[int, int] | None, ifname: str | None, calls: int) -> dict:
    """Bytes per timed call on the host link, each way: the warm-ups left out, as they are of
    the times (a warm-up of a switch strategy also agrees each slot's scale, which the timed
    calls, speculating, skip). {} where the interface could not be read."""
    end = link_bytes(ifname)
    if start is None or end is None or calls <= 0:
        return {}
    return {"timed_tx_bytes": (end[0] - start[0]) / calls,
            "timed_rx_bytes": (end[1] - start[1]) / calls}


def stream_counts(stats) -> dict:
    """What this rank's own switch stream sent (zero for strategies without one)."""
    return {"packets": stats.packets if stats else 0,
            "retransmissions": stats.retransmissions if stats else 0,
            "fast_retransmissions": stats.fast_retransmissions if stats else 0,
            "probes": stats.probes if stats else 0,
            "rotated": stats.rotated if stats else 0,
            # fragments sent at a speculative scale, and those of them sent again
            "speculated": stats.speculated if stats else 0,
            "spec_missed": stats.spec_missed if stats else 0,
            # passes of the window's loop that took results, those after which it waited
            # for more (host_agent.stream, gathering), and how long it waited in all
            "passes": stats.passes if stats else 0,
            "gathers": stats.gathers if stats else 0,
            "gathered_s": stats.gathered_s if stats else 0.0,
            # the congestion window (host_agent.congestion): results that came marked, times
            # it shrank, and its size after the last call
            "marks": stats.marks if stats else 0,
            "window_cuts": stats.window_cuts if stats else 0,
            "window": stats.window if stats else 0}
