"""The ingress counters (p4src/passing.p4): job_stats, global_drops, egress_drops (read only)."""

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

    def reset_updates(self, stat_idx: int) -> list[Update]:
        """Zero a job's row, so that a reused row starts from zero for a new job."""
        ups = []
        counter_id = self.sw.info.counter("job_stats").preamble.id
        for e in range(P.JOB_STATS_STRIDE):
            u = Update(type=Update.MODIFY)
            ce = u.entity.counter_entry
            ce.counter_id = counter_id
            ce.index.index = stat_idx * P.JOB_STATS_STRIDE + e
            ce.data.packet_count = 0
            ce.data.byte_count = 0
            ups.append(u)
        return ups

    def global_drops(self) -> dict[str, int]:
        cells = self.sw.read_counter("global_drops")
        out = {r.name.lower(): cells.get(r.value, (0, 0))[0] for r in P.GlobalDrop}
        out["no_peer"] = self.sw.read_counter("egress_drops", 0)[0][0]
        return out
