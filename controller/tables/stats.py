"""Counters of the Aggregation control and the ingress drop counters (read only)."""

from __future__ import annotations

from controller.switch import SwitchConnection
from passing import protocol as P


class StatsCounters:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def job(self, stat_idx: int) -> dict[str, int]:
        """Packet counts of one job at this switch: one entry per JOB_COUNTERS name, plus
        drops_<reason> per JobDrop."""
        out = {name: self.sw.read_counter(name, stat_idx)[stat_idx][0] for name in P.JOB_COUNTERS}
        base = stat_idx * P.JOB_DROP_STRIDE
        drops = self.sw.read_counter("job_drops")
        for reason in P.JobDrop:
            out["drops_" + reason.name.lower()] = drops.get(base + reason.value, (0, 0))[0]
        return out

    def global_drops(self) -> dict[str, int]:
        cells = self.sw.read_counter("global_drops")
        out = {r.name.lower(): cells.get(r.value, (0, 0))[0] for r in P.GlobalDrop}
        out["no_peer"] = self.sw.read_counter("egress_drops", 0)[0][0]
        return out
