"""Table of the ResultGuard control (p4src/include/guard.p4): result_guard.

The table is keyed by UDP destination port alone, not by job: a port belongs to at most one job
on a switch, and traffic addressed to it that is not a result of that switch is counted in the
job's `job_stats` row as JobDrop.FORGED_RESULT.
"""

from __future__ import annotations

from controller.switch import SwitchConnection, Update


class ResultGuardTables:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def guard_update(self, kind: int, udp_port: int, stat_idx: int) -> Update:
        """Drop non-aggregation UDP to `udp_port`, counted in counter row `stat_idx`."""
        return self.sw.table_update(kind, "result_guard", {"udp_port": udp_port}, "guard_port",
                                    {"stat_idx": stat_idx})

    def guard_delete(self, udp_port: int) -> Update:
        return self.sw.table_update(Update.DELETE, "result_guard", {"udp_port": udp_port})

    def guards(self) -> dict[int, int]:
        """UDP port -> the counter row (stat_idx) its drops are counted in."""
        return {r["match"]["udp_port"]: r["params"]["stat_idx"]
                for r in self.sw.read_table("result_guard")}
