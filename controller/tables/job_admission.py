"""Tables of the JobAdmission control (p4src/include/job_admission.p4): job_config, membership."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from controller.switch import SwitchConnection, Update
from passing import protocol as P


@dataclass(frozen=True)
class JobConfig:
    """One job's parameters at one switch (the set_job action's parameters)."""

    job_id: int
    pool_base: int
    pool_size: int
    fan_in: int
    mcast_grp: int
    gen: int
    is_root: int
    uplink_port: int
    stat_idx: int
    # Contributions a CLOSE request may complete a round with (docs/protocol.md, Quorum);
    # 0 means fan_in: every round waits for everyone (bulk-synchronous).
    quorum: int = 0
    # The entry's second key, the packets' FLAG_POOL: which of the job's two pools this is
    # (a live resize installs the new pool under the other one; docs/protocol.md).
    pool: int = 0
    # That pool's epoch, its number mod 128 (passing.protocol.pool_epoch; its low bit is
    # `pool`): packets must carry it in their version, so a delayed one of the pool two resizes
    # back, under the same bit, is dropped (DROP_STALE_POOL) instead of taking slots over.
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.fan_in <= P.MAX_FAN_IN:
            raise ValueError(f"fan-in {self.fan_in} outside 1..{P.MAX_FAN_IN}")
        if self.quorum == 0:
            object.__setattr__(self, "quorum", self.fan_in)
        if not 1 <= self.quorum <= self.fan_in:
            raise ValueError(f"quorum {self.quorum} outside 1..{self.fan_in} (the fan-in)")
        # Size 0 (base 0): the pool of a job waiting for slots, which describes its other
        # entries and is never written (installer.Desired.configs leaves it out).
        if (self.pool_size < 1 or self.pool_base + self.pool_size > P.SLOT_CAPACITY) and (
                self.pool_size, self.pool_base) != (0, 0):
            raise ValueError(f"pool {self.pool_base}+{self.pool_size} outside the switch's "
                             f"{P.SLOT_CAPACITY} slots")
        if not 0 <= self.stat_idx < P.MAX_JOBS:
            raise ValueError(f"stat_idx {self.stat_idx} outside 0..{P.MAX_JOBS - 1}")
        if self.gen == 0:
            raise ValueError("generation 0 is what a freshly started switch holds; use >= 1")
        if self.pool not in (0, 1):
            raise ValueError(f"pool {self.pool} is not 0 or 1")
        if not 0 <= self.epoch <= P.POOL_EPOCH_MASK or self.epoch & 1 != self.pool:
            raise ValueError(f"pool epoch {self.epoch}: 0..{P.POOL_EPOCH_MASK} with the pool bit "
                             f"{self.pool} as its low bit")


class JobAdmissionTables:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def job_update(self, kind: int, cfg: JobConfig) -> Update:
        params = {k: v for k, v in asdict(cfg).items() if k not in ("job_id", "pool")}
        return self.sw.table_update(kind, "job_config", {"job_id": cfg.job_id, "pool": cfg.pool},
                                    "set_job", params)

    def job_delete(self, job_id: int, pool: int = 0) -> Update:
        return self.sw.table_update(Update.DELETE, "job_config", {"job_id": job_id, "pool": pool})

    def member_update(self, kind: int, job_id: int, port: int, contributor: int,
                      count: int = 1) -> Update:
        """Port `port` may send as contributors contributor .. contributor + count - 1."""
        if count < 1 or not 0 <= contributor <= contributor + count - 1 < P.MAX_FAN_IN:
            raise ValueError(f"contributor ids {contributor}..{contributor + count - 1} "
                             f"outside 0..{P.MAX_FAN_IN - 1}")
        return self.sw.table_update(kind, "membership", {"job_id": job_id, "ingress_port": port},
                                    "set_member", {"contributor": contributor, "count": count})

    def member_delete(self, job_id: int, port: int) -> Update:
        return self.sw.table_update(Update.DELETE, "membership",
                                    {"job_id": job_id, "ingress_port": port})

    def jobs(self) -> dict[tuple[int, int], JobConfig]:
        """(job, pool) -> the entry."""
        return {(r["match"]["job_id"], r["match"]["pool"]):
                JobConfig(job_id=r["match"]["job_id"], pool=r["match"]["pool"], **r["params"])
                for r in self.sw.read_table("job_config")}

    def members(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(job, port) -> (first contributor id, count)."""
        return {(r["match"]["job_id"], r["match"]["ingress_port"]):
                (r["params"]["contributor"], r["params"]["count"])
                for r in self.sw.read_table("membership")}
