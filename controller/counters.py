"""The ingress counters (p4src/passing.p4): job_stats, late_contribs, global_drops, egress_drops
(read only)."""

from __future__ import annotations

from controller.switch import SwitchConnection, Update
from passing import protocol as P


class StatsCounters:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def events(self, stat_idx: int) -> dict[int, int]:
        """Packets per event (JobDrop and JobEvent values) of one job at this switch."""
        base = stat_idx * P.JOB_STATS_STRIDE
        cells = self.sw.read_counter("job_stats")
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
        cells = self.sw.read_counter("late_contribs")
        return {c: n for c in range(P.MAX_FAN_IN) if (n := cells.get(base + c, (0, 0))[0])}

    def reset_updates(self, stat_idx: int) -> list[Update]:
        """Zero a job's rows, so that a reused row starts from zero for a new job."""
        ups = []
        for counter, stride in (("job_stats", P.JOB_STATS_STRIDE),
                                ("late_contribs", P.MAX_FAN_IN)):
            counter_id = self.sw.info.counter(counter).preamble.id
            for e in range(stride):
                u = Update(type=Update.MODIFY)
                ce = u.entity.counter_entry
                ce.counter_id = counter_id
                ce.index.index = stat_idx * stride + e
                ce.data.packet_count = 0
                ce.data.byte_count = 0
                ups.append(u)
        return ups

    def global_drops(self) -> dict[str, int]:
        cells = self.sw.read_counter("global_drops")
        out = {r.name.lower(): cells.get(r.value, (0, 0))[0] for r in P.GlobalDrop}
        out["no_peer"] = self.sw.read_counter("egress_drops", 0)[0][0]
        return out
