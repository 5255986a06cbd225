"""The ingress counters (p4src/passing.p4): job_stats, late_contribs, pool_contribs,
global_drops, egress_drops (read only)."""

from __future__ import annotations

from controller.switch import SwitchConnection, Update
from passing import protocol as P


class StatsCounters:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def events(self, stat_idx: int) -> dict[int, int]:
        """Packets per event (JobDrop and JobEvent values) of one job at this switch."""
        base = stat_idx * P.JOB_STATS_STRIDE
        # Only this job's row: the whole counter (every job's) took the model ~0.5 s to send.
        cells = self.sw.read_counter_cells("job_stats", range(base, base + P.JOB_STATS_STRIDE))
        return {e: cells.get(base + e, (0, 0))[0] for e in range(P.JOB_STATS_STRIDE)}

    def job(self, stat_idx: int) -> dict[str, int]:
        """Per-job totals: one entry per JOB_COUNTERS name, plus drops_<reason> per JobDrop."""
        ev = self.events(stat_idx)
        out = {name: sum(ev[e] for e in events) for name, events in P.JOB_COUNTERS.items()}
        for reason in P.JobDrop:
            out["drops_" + reason.name.lower()] = ev[reason.value]
        return out

    def late(self, stat_idx: int) -> dict[int, int]:
        """Late contributions (not added: their round had closed here or was left behind) per
        contributor id of one job at this switch; ids with none are left out."""
        base = stat_idx * P.MAX_FAN_IN
        cells = self.sw.read_counter_cells("late_contribs", range(base, base + P.MAX_FAN_IN))
        return {c: n for c in range(P.MAX_FAN_IN) if (n := cells.get(base + c, (0, 0))[0])}

    def pool_contribs(self, stat_idx: int, bit: int) -> dict[int, int]:
        """Contributions admitted in one of a job's two pools (`bit`, the packets' FLAG_POOL)
        per contributor id at this switch; ids with none are left out."""
        base = _pool_row(stat_idx, bit)
        # The counter has MAX_JOBS * 2 * MAX_FAN_IN cells: only this row is read.
        cells = self.sw.read_counter_cells("pool_contribs", range(base, base + P.MAX_FAN_IN))
        return {c: n for c in range(P.MAX_FAN_IN) if (n := cells.get(base + c, (0, 0))[0])}

    def reset_updates(self, stat_idx: int) -> list[Update]:
        """Zero a job's rows, so that a reused row starts from zero for a new job."""
        ups = self._zero("job_stats", stat_idx * P.JOB_STATS_STRIDE, P.JOB_STATS_STRIDE)
        ups += self._zero("late_contribs", stat_idx * P.MAX_FAN_IN, P.MAX_FAN_IN)
        for bit in (0, 1):
            ups += self.pool_reset_updates(stat_idx, bit)
        return ups

    def pool_reset_updates(self, stat_idx: int, bit: int) -> list[Update]:
        """Zero a job's pool_contribs row for one pool bit: written before a pool is installed
        under that bit, so that counts left by an earlier pool under it cannot pass for hosts
        having moved to the new one."""
        return self._zero("pool_contribs", _pool_row(stat_idx, bit), P.MAX_FAN_IN)

    def _zero(self, counter: str, first: int, count: int) -> list[Update]:
        counter_id = self.sw.info.counter(counter).preamble.id
        ups = []
        for index in range(first, first + count):
            u = Update(type=Update.MODIFY)
            ce = u.entity.counter_entry
            ce.counter_id = counter_id
            ce.index.index = index
            ce.data.packet_count = 0
            ce.data.byte_count = 0
            ups.append(u)
        return ups

    def global_drops(self) -> dict[str, int]:
        cells = self.sw.read_counter("global_drops")
        out = {r.name.lower(): cells.get(r.value, (0, 0))[0] for r in P.GlobalDrop}
        out["no_peer"] = self.sw.read_counter("egress_drops", 0)[0][0]
        return out


def _pool_row(stat_idx: int, bit: int) -> int:
    """The first pool_contribs cell of a job's pool: (stat_idx * 2 + bit) * MAX_FAN_IN."""
    return (stat_idx * 2 + bit) * P.MAX_FAN_IN
