"""A job's entries on one switch: what they should be, writing them, removing them, comparing.

Everything a job needs on a switch is described as data first (`Desired`), so that install,
rollback, delete and reconcile all work from the same description. `install` and `remove` need
only a `SwitchWriter`: the testbed applies the same description to an in-process switch model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from controller.job_plan import SwitchRole
from controller.switch import SwitchConnection, SwitchError, SwitchWriter, Update, WriteError
from controller.tables.guard import ResultGuardTables
from controller.tables.job_admission import JobAdmissionTables, JobConfig
from controller.tables.peers import Peer, PeerRewriteTables
from controller.topology import Switch
from passing.p4info import encode_value


@dataclass(frozen=True)
class PoolParams:
    """The per-switch resources of a job (a subset of controller.store.PoolRecord)."""

    base: int
    size: int
    gen: int
    stat_idx: int
    mcast_grp: int
    epoch: int = 0  # the pool's number mod 128; its low bit is FLAG_POOL, job_config's second key


@dataclass(frozen=True)
class OldPool:
    """A job's retiring pool on a switch (controller.store.RetiringPool): a second job_config
    entry, under the other pool bit, that differs from the current one only in its slots,
    generation and epoch."""

    base: int
    size: int
    gen: int
    epoch: int  # the retiring pool's number mod 128


@dataclass
class Desired:
    job: JobConfig
    members: dict[int, tuple[int, int]] = field(default_factory=dict)  # port -> (id, count)
    # (egress port, rid) -> peer; rid is the recipient's contributor id, 0 for the uplink
    peers: dict[tuple[int, int], Peer] = field(default_factory=dict)
    replicas: list[tuple[int, int]] = field(default_factory=list)  # (port, rid)
    # UDP port an agent of the job receives on -> the job's counter row at this switch
    guards: dict[int, int] = field(default_factory=dict)
    # The job's retiring pool here, during a live resize: its second job_config entry. The
    # other entries (members, peers, group, guards) serve both pools.
    retiring: JobConfig | None = None

    def configs(self) -> list[JobConfig]:
        """The job's job_config entries: its pool's (none while the job waits for slots, its
        pool empty), then its retiring pool's if any."""
        return ([self.job] if self.job.pool_size else []) + (
            [self.retiring] if self.retiring is not None else [])


def desired(role: SwitchRole, pool: PoolParams, job_id: int, switch: Switch,
            guard_ports: Iterable[int] = (), quorum: int = 0,
            retiring: OldPool | None = None) -> Desired:
    """guard_ports: the agent ports this switch guards for the job; every switch of a job
    guards all of them, since a forged result could enter the fabric at any of its switches.
    quorum: what a CLOSE request may complete a round with here (0: the fan-in). retiring: the
    pool a live resize is moving the job away from."""
    cfg = JobConfig(job_id, pool.base, pool.size, role.fan_in, pool.mcast_grp, pool.gen,
                    int(role.is_root), role.uplink.port if role.uplink else 0,
                    pool.stat_idx, quorum, pool.epoch & 1, pool.epoch)
    d = Desired(cfg, guards={port: pool.stat_idx for port in guard_ports})
    if retiring is not None:
        d.retiring = replace(cfg, pool_base=retiring.base, pool_size=retiring.size,
                             gen=retiring.gen, pool=retiring.epoch & 1, epoch=retiring.epoch)
    for m in role.members:
        d.members[m.port] = (m.contributor, m.count)
        for i, cid in enumerate(m.ids):
            d.peers[m.port, cid] = Peer(m.mac, switch.mac, m.ip, switch.ip, m.udp_port + i, cid)
            d.replicas.append((m.port, cid))
    if role.uplink is not None:
        u = role.uplink
        d.peers[u.port, 0] = Peer(u.mac, switch.mac, u.ip, switch.ip, u.udp_port, u.contributor)
    return d


def _updates(conn: SwitchWriter, d: Desired, kind: int) -> list[Update]:
    adm, peers, guard = JobAdmissionTables(conn), PeerRewriteTables(conn), ResultGuardTables(conn)
    jid = d.job.job_id
    if kind == Update.DELETE:
        ups = [adm.job_delete(jid, cfg.pool) for cfg in d.configs()]
        ups += [adm.member_delete(jid, port) for port in d.members]
        ups += [peers.peer_delete(jid, port, rid) for port, rid in d.peers]
        ups.append(conn.multicast_update(Update.DELETE, d.job.mcast_grp))
        ups += [guard.guard_delete(port) for port in d.guards]
        return ups
    ups = [adm.job_update(kind, cfg) for cfg in d.configs()]
    ups += [adm.member_update(kind, jid, port, cid, n) for port, (cid, n) in d.members.items()]
    ups += [peers.peer_update(kind, jid, port, rid, peer)
            for (port, rid), peer in d.peers.items()]
    ups.append(conn.multicast_update(kind, d.job.mcast_grp, d.replicas))
    ups += [guard.guard_update(kind, port, idx) for port, idx in d.guards.items()]
    return ups


def _delete_of(u: Update) -> Update:
    """The DELETE that undoes INSERT `u` (the entity's key is all a DELETE needs)."""
    undo = Update(type=Update.DELETE)
    undo.entity.CopyFrom(u.entity)
    if undo.entity.HasField("table_entry"):
        undo.entity.table_entry.ClearField("action")  # as table_update builds its DELETEs
    return undo


def install(conn: SwitchWriter, d: Desired) -> None:
    """All of the job's entries on this switch, or none of them."""
    ups = _updates(conn, d, Update.INSERT)
    try:
        conn.write(ups)
    except WriteError as e:
        # Undo only the inserts that succeeded: the ones that failed (ALREADY_EXISTS, say)
        # collided with entries that someone else owns, such as a stray entry left by a lost
        # state file, and deleting those would break whatever still relies on them.
        failed = {i for i, _, _ in e.failures}
        try:
            conn.write([_delete_of(u) for i, u in enumerate(ups) if i not in failed])
        except SwitchError:
            pass  # what could not be undone is reported by the next reconcile as stray
        raise
    except SwitchError:
        remove(conn, d)  # which updates were applied is unknown: delete them all
        raise


def remove(conn: SwitchWriter, d: Desired) -> None:
    """Delete the job's entries; entries already absent are fine (safe to repeat)."""
    try:
        conn.write(_updates(conn, d, Update.DELETE))
    except WriteError as e:
        if any(code != "NOT_FOUND" for _, code, _ in e.failures):
            raise


@dataclass
class SwitchSnapshot:
    """What one switch holds, as read back over P4Runtime."""

    jobs: dict[tuple[int, int], JobConfig]  # (job, pool) ->
    members: dict[tuple[int, int], tuple[int, int]]
    peers: dict[tuple[int, int, int], dict]
    groups: dict[int, list[tuple[int, int]]]
    guards: dict[int, int]  # udp port -> stat_idx

    @classmethod
    def read(cls, conn: SwitchConnection) -> SwitchSnapshot:
        return cls(JobAdmissionTables(conn).jobs(), JobAdmissionTables(conn).members(),
                   PeerRewriteTables(conn).peers(), conn.read_multicast_groups(),
                   ResultGuardTables(conn).guards())


def _peer_params(peer: Peer) -> dict[str, int]:
    widths = {"dst_mac": 48, "src_mac": 48, "dst_ip": 32, "src_ip": 32, "dst_port": 16,
              "contributor": 8}
    return {k: int.from_bytes(encode_value(v, widths[k]), "big") for k, v in asdict(peer).items()}


def _job_entry(job_id: int, pool: int) -> str:
    return f"job_config[{job_id}]" if pool == 0 else f"job_config[{job_id}, pool {pool}]"


def differences(snap: SwitchSnapshot, d: Desired) -> list[str]:
    """Human-readable list of what differs from `d` on the switch; empty when in sync."""
    jid = d.job.job_id
    out = []
    for cfg in d.configs():
        have = snap.jobs.get((jid, cfg.pool))
        if have != cfg:
            out.append(f"{_job_entry(jid, cfg.pool)}: " +
                       ("missing" if have is None else f"is {have}"))
    for port, member in d.members.items():
        if snap.members.get((jid, port)) != member:
            out.append(f"membership[{jid}, port {port}]: missing or wrong")
    for (port, rid), peer in d.peers.items():
        if snap.peers.get((jid, port, rid)) != _peer_params(peer):
            out.append(f"peer_rewrite[{jid}, port {port}, rid {rid}]: missing or wrong")
    if sorted(snap.groups.get(d.job.mcast_grp, [])) != sorted(d.replicas):
        out.append(f"multicast group {d.job.mcast_grp}: missing or wrong")
    for port, idx in sorted(d.guards.items()):
        have_idx = snap.guards.get(port)
        if have_idx != idx:
            out.append(f"result_guard[udp port {port}]: " + (
                "missing" if have_idx is None else f"counts into stat_idx {have_idx}, not {idx}"))
    return out


def strays(snap: SwitchSnapshot, wanted: dict[int, Desired],
           reserved_groups: set[int]) -> list[str]:
    """Entries on the switch that no known job accounts for."""
    out = []
    for jid, pool in sorted(snap.jobs):
        if jid not in wanted or pool not in {cfg.pool for cfg in wanted[jid].configs()}:
            out.append(_job_entry(jid, pool))
    for jid, port in sorted(snap.members):
        if jid not in wanted or port not in wanted[jid].members:
            out.append(f"membership[{jid}, port {port}]")
    for jid, port, rid in sorted(snap.peers):
        if jid not in wanted or (port, rid) not in wanted[jid].peers:
            out.append(f"peer_rewrite[{jid}, port {port}, rid {rid}]")
    groups = {d.job.mcast_grp for d in wanted.values()} | reserved_groups
    out += [f"multicast group {g}" for g in sorted(set(snap.groups) - groups)]
    guarded = {port for d in wanted.values() for port in d.guards}
    out += [f"result_guard[udp port {p}]" for p in sorted(set(snap.guards) - guarded)]
    return out


def repair(conn: SwitchConnection, snap: SwitchSnapshot, d: Desired) -> None:
    """Make the switch hold exactly `d` for this job: insert what is missing, modify what is
    wrong. Entries of this job that `d` does not have are removed, except guard entries: those
    are keyed by port alone, so which job one belongs to is a guess, and one no job wants is
    reported by `strays` like any other unknown entry."""
    adm, peers, guard = JobAdmissionTables(conn), PeerRewriteTables(conn), ResultGuardTables(conn)
    jid = d.job.job_id
    ups = []
    for cfg in d.configs():
        if (jid, cfg.pool) not in snap.jobs:
            ups.append(adm.job_update(Update.INSERT, cfg))
        elif snap.jobs[jid, cfg.pool] != cfg:
            ups.append(adm.job_update(Update.MODIFY, cfg))
    for port, (cid, n) in d.members.items():
        have = snap.members.get((jid, port))
        if have != (cid, n):
            kind = Update.INSERT if have is None else Update.MODIFY
            ups.append(adm.member_update(kind, jid, port, cid, n))
    for (j, port) in snap.members:
        if j == jid and port not in d.members:
            ups.append(adm.member_delete(jid, port))
    for (port, rid), peer in d.peers.items():
        have = snap.peers.get((jid, port, rid))
        if have != _peer_params(peer):
            kind = Update.INSERT if have is None else Update.MODIFY
            ups.append(peers.peer_update(kind, jid, port, rid, peer))
    for (j, port, rid) in snap.peers:
        if j == jid and (port, rid) not in d.peers:
            ups.append(peers.peer_delete(jid, port, rid))
    have_group = snap.groups.get(d.job.mcast_grp)
    if have_group is None:
        ups.append(conn.multicast_update(Update.INSERT, d.job.mcast_grp, d.replicas))
    elif sorted(have_group) != sorted(d.replicas):
        ups.append(conn.multicast_update(Update.MODIFY, d.job.mcast_grp, d.replicas))
    for port, idx in d.guards.items():
        have_idx = snap.guards.get(port)
        if have_idx != idx:
            kind = Update.INSERT if have_idx is None else Update.MODIFY
            ups.append(guard.guard_update(kind, port, idx))
    conn.write(ups)


def hand_over_guards(conn: SwitchConnection, guards: dict[int, int]) -> None:
    """Point each guarded port at a new counter row (a port whose owner is leaving but which
    another live job also receives on); missing entries are inserted."""
    if not guards:
        return
    guard = ResultGuardTables(conn)
    have = guard.guards()
    conn.write([guard.guard_update(Update.INSERT if port not in have else Update.MODIFY,
                                   port, idx)
                for port, idx in guards.items() if have.get(port) != idx])
