"""Jobs: what an operator asks for (JobSpec) and how it maps onto the fabric (JobPlan).

A job is either `passing` (each server pre-aggregates its GPUs and is one contributor) or `ina`
(switch-only in-network aggregation, the SwitchML/ATP baseline: every GPU of every server is its
own contributor, so a server's port carries as many streams as it has GPUs).

A job's switches form a tree over the fabric (controller.job_tree): its ToR alone for a job in
one rack; else its ToRs under a spine; else, for racks no one spine links, its ToRs under a
spine per pod under a core. Each switch of the tree holds a pool: fan-in = its contributors
there (the job's hosts in the rack at a ToR, the ToRs below at a spine, the spines below at a
core); all but the root send their sums up through their uplink. A switch's level is its tier
(0 ToR, 1 spine, 2 core), whatever the tree's depth. Contributor ids are positions: hosts
ordered by port within their rack at a ToR (in `ina`, a host's GPUs get consecutive ids), the
switches below ordered by name at a spine or core.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from controller import job_tree
from controller.topology import ROLES, Topology
from passing import protocol as P
from passing.contract import MAX_STALENESS, MODES, check_patience

# Agent ports are allocated from here up: above Linux's default ephemeral range (32768-60999),
# so that the switches' guard of these ports never drops an ordinary flow's reply.
DEFAULT_AGENT_PORT_BASE = 61000
LEGACY_AGENT_PORT_BASE = 40000  # what a stored agent_port 0 meant before ports were allocated
# A quorum per level of the deepest tree a fabric has: ToRs, spines, cores.
MAX_LEVELS = len(ROLES)
LEVEL_NAMES = "at the hosts' switches, then at the spines, then at the cores"


class JobError(ValueError):
    """A job that cannot be created as asked; the message says why."""


@dataclass(frozen=True)
class JobSpec:
    """What an operator asks for.

    Glossary: a job's *window* is the number of aggregation slots it holds on each of its
    switches, which is also how many packets each of its agents keeps in flight; the slots on
    one switch are the job's *pool* there (SlotRange/PoolRecord `size`, P4 `pool_size`, the
    agents' parameter "window" are all the window).
    """

    job_id: int
    hosts: tuple[str, ...]
    window: int  # wanted
    min_window: int | None = None  # accept a smaller window down to this, when short
    # A job shrunk for jobs waiting for slots: the window it had asked for, which it grows
    # back toward when slots free (controller.waiting). None: it has what it asked for.
    asked_window: int | None = None
    k: int = P.K
    scale_bits: int = 0  # 0: the agents choose the fixed-point scale per block (see host agent)
    # The first UDP port the agents receive results on. The controller resolves 0 to a free
    # range when it creates the job and stores the result; a stored 0 (state files written
    # before that) keeps meaning 40000 + job_id % 20000.
    agent_port: int = 0
    mode: str = "passing"  # or "ina": every GPU streams to the switch (see the module doc)
    # The job's secret (hex), given to its agents only: they key their sessions with it, so
    # that nobody who reads their rendezvous can compute a session (host_agent.session). The
    # controller draws one when it creates the job; "" (older state files) means unkeyed.
    session_key: str = ""
    # Per switch level (0: the switch the hosts are on, 1: a spine, 2: a core), how many of a
    # slot's contributions a CLOSE request may complete a round with (docs/protocol.md,
    # "Rounds, quorum and late contributions"); a switch with fewer contributors uses its
    # fan-in. Empty, or a level left out: every round waits for everyone (bulk-synchronous).
    # Levels the job's tree does not reach are not used.
    quorum: tuple[int, ...] = ()
    # The agents' side of a quorum, handed to them in their parameters (docs/pytorch.md):
    # seconds a round waits before a host asks to close it, (P,) fixed, (MIN, MAX) adaptive,
    # () never (every round waits for everyone); and how many calls in a row may leave some
    # GPU out before one waits for everyone. Running agents change to new ones after the same
    # call (host_agent.pool_move); `policy` counts the changes (`passing-ctl job set`), so
    # that agents can tell which of two policies is the newer.
    patience: tuple[float, ...] = ()
    staleness: int = 1
    policy: int = 0
    # The switches above the ToRs that aggregate the job (spines, a core; job_tree.Tree.above),
    # chosen when it was created: the same tree for its whole life, however the slots of the
    # switches it could have used change. () for a job in one rack, and in state files written
    # before several spines: the choice by name, on those fabrics' one spine.
    tree: tuple[str, ...] = ()
    # A `passing` job its switches cannot hold now (their slots or job entries are taken, its
    # window within the equal share) is created all the same, waiting for slots: its hosts sum
    # with a host collective until the controller gives it pools (controller.waiting). False:
    # refused instead, as `ina` jobs always are.
    fallback: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.job_id <= 0xFFFF:
            raise JobError(f"job id {self.job_id} outside 1..65535")
        if not self.hosts:
            raise JobError("a job needs at least one host")
        if len(set(self.hosts)) != len(self.hosts):
            raise JobError("a host is listed twice")
        if self.window < 1:
            raise JobError("window must be at least 1 slot")
        if self.min_window is not None and not 1 <= self.min_window <= self.window:
            raise JobError(f"min window must be in 1..{self.window}")
        if self.asked_window is not None and self.asked_window <= self.window:
            raise JobError(f"asked window {self.asked_window}: more than the window "
                           f"{self.window}, or none")
        if self.k != P.K:
            raise JobError(f"K={self.k} but the P4 program was compiled with K={P.K}")
        if not 0 <= self.agent_port <= 0xFFFF:
            raise JobError(f"agent port {self.agent_port} outside 0..65535")
        if self.mode not in MODES:
            raise JobError(f"mode {self.mode!r}: choose {' or '.join(MODES)}")
        try:
            bytes.fromhex(self.session_key)
        except ValueError:
            raise JobError("session key must be hexadecimal") from None
        if len(self.quorum) > MAX_LEVELS or any(type(q) is not int or not 1 <= q <= P.MAX_FAN_IN
                                                for q in self.quorum):
            raise JobError(f"quorum {list(self.quorum)}: one to {MAX_LEVELS} whole numbers "
                           f"({LEVEL_NAMES}), each in 1..{P.MAX_FAN_IN}")
        if any(type(s) is not str for s in self.tree) or len(set(self.tree)) != len(self.tree):
            raise JobError(f"tree {list(self.tree)}: switch names, each once")
        try:
            check_patience(self.patience)
        except ValueError as e:
            raise JobError(str(e)) from None
        if type(self.fallback) is not bool:
            raise JobError(f"fallback {self.fallback!r}: true or false")
        if type(self.staleness) is not int or not 0 <= self.staleness <= MAX_STALENESS:
            raise JobError(f"staleness {self.staleness!r}: a whole number of calls, "
                           f"0..{MAX_STALENESS}")

    @property
    def udp_port(self) -> int:
        return self.agent_port or LEGACY_AGENT_PORT_BASE + self.job_id % 20000

    def port_width(self, topo: Topology) -> int:
        """How many consecutive agent ports the job needs: the most ranks any of its hosts
        receives on (one per host in `passing`, one per GPU in `ina`)."""
        if self.mode != "ina":
            return 1
        return max((topo.hosts[h].gpus for h in self.hosts if h in topo.hosts), default=1)

    def agent_ports(self, topo: Topology) -> range:
        """Every UDP port an agent of the job receives results on (see Member.udp_port)."""
        return range(self.udp_port, self.udp_port + self.port_width(topo))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        d["quorum"] = list(self.quorum)
        d["patience"] = list(self.patience)
        d["tree"] = list(self.tree)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> JobSpec:
        """A stored job. Its K is the build's, not the stored one: a job's entries (slots,
        members, groups) do not depend on K, which is one compile-time number for the switches
        and all agents (PASSING_K), so a job stored under another K is installed as it is."""
        fields_ = {k: v for k, v in d.items() if k != "k"}
        return cls(**{**fields_, "hosts": tuple(d["hosts"]),
                      "quorum": tuple(d.get("quorum", ())),
                      "patience": tuple(d.get("patience", ())),
                      "tree": tuple(d.get("tree", ()))})


@dataclass(frozen=True)
class Member:
    """One contributor of a job at one switch: a host (at a ToR) or a switch of the tier
    below (a ToR at a spine, a spine at a core)."""

    name: str
    port: int
    contributor: int  # the first id; a host in an `ina` job has `count` consecutive ones
    ip: str
    mac: str
    udp_port: int  # of the first id; id contributor + i receives on udp_port + i
    count: int = 1

    @property
    def ids(self) -> range:
        return range(self.contributor, self.contributor + self.count)


@dataclass(frozen=True)
class SwitchRole:
    """What one switch does for one job."""

    switch: str
    is_root: bool
    members: tuple[Member, ...]
    uplink: Member | None = None  # at a non-root: the switch above, and this one's id there
    level: int = 0  # the switch's tier: 0 ToR, 1 spine, 2 core

    @property
    def fan_in(self) -> int:
        return sum(m.count for m in self.members)


@dataclass
class JobPlan:
    spec: JobSpec
    roles: dict[str, SwitchRole] = field(default_factory=dict)
    tree: tuple[str, ...] = ()  # the switches above the ToRs (JobSpec.tree)

    @property
    def switches(self) -> list[str]:
        # Lower levels first: a switch is configured before the one it sends to.
        return sorted(self.roles, key=lambda s: (self.level(s), s))

    def level(self, switch: str) -> int:
        """0 for a switch the job's hosts are on, 1 for a spine, 2 for a core."""
        return self.roles[switch].level

    @property
    def depth(self) -> int:
        """The root's level: 0 for a job in one rack."""
        return max(r.level for r in self.roles.values())

    def quorum_at(self, switch: str) -> int:
        """The quorum the switch is configured with: the spec's for its level, at most its
        fan-in; its fan-in (bulk-synchronous) where the spec gives none."""
        fan_in = self.roles[switch].fan_in
        level = self.level(switch)
        q = self.spec.quorum[level] if level < len(self.spec.quorum) else fan_in
        return min(q, fan_in)


def plan(spec: JobSpec, topo: Topology, rank: job_tree.Rank | None = None) -> JobPlan:
    """The job's roles on `topo`. With `rank`, a job that has no tree yet chooses one
    (job_tree.choose; the controller ranks by free slots); otherwise the job's stored tree
    (job_tree.rebuild)."""
    unknown = [h for h in spec.hosts if h not in topo.hosts]
    if unknown:
        raise JobError(f"host(s) not in topology {topo.name}: {', '.join(unknown)} "
                       f"(have: {', '.join(topo.hosts)})")
    racks: dict[str, list] = {}
    for h in spec.hosts:
        host = topo.hosts[h]
        racks.setdefault(host.rack, []).append(host)
    try:
        if rank is not None and not spec.tree:
            tree = job_tree.choose(topo, sorted(racks), rank)
        else:
            tree = job_tree.rebuild(topo, sorted(racks), spec.tree)
    except job_tree.TreeError as e:
        raise JobError(f"job {spec.job_id}: {e}") from None
    out = JobPlan(spec, tree=tree.above(topo))
    for rack in sorted(racks):
        hosts = sorted(racks[rack], key=lambda h: h.port)
        counts = [h.gpus if spec.mode == "ina" else 1 for h in hosts]
        if sum(counts) > P.MAX_FAN_IN:
            what = "GPUs" if spec.mode == "ina" else "hosts"
            raise JobError(f"rack {rack}: {sum(counts)} {what}, at most {P.MAX_FAN_IN} "
                           "contributors per switch")
        members = tuple(Member(h.name, h.port, sum(counts[:i]), h.ip, h.mac, spec.udp_port,
                               counts[i]) for i, h in enumerate(hosts))
        out.roles[rack] = SwitchRole(rack, rack == tree.root, members, _uplink(topo, tree, rack))
    for sw in tree.switches:
        if sw in racks:
            continue
        below = tree.children(sw)
        if len(below) > P.MAX_FAN_IN:
            raise JobError(f"{sw}: {len(below)} switches of the job below it, at most "
                           f"{P.MAX_FAN_IN} contributors per switch")
        members = []
        for i, child in enumerate(below):
            c = topo.switches[child]
            members.append(Member(child, topo.link_between(sw, child).upper_port, i, c.ip,
                                  c.mac, P.PASSING_UDP_PORT))
        out.roles[sw] = SwitchRole(sw, sw == tree.root, tuple(members), _uplink(topo, tree, sw),
                                   topo.tier(sw))
    return out


def _uplink(topo: Topology, tree: job_tree.Tree, switch: str) -> Member | None:
    """The switch above `switch` in the tree, as it is addressed from `switch`: its port
    there, and `switch`'s contributor id above (its position among its siblings)."""
    parent = tree.parent.get(switch)
    if parent is None:
        return None
    up = topo.switches[parent]
    return Member(parent, topo.link_between(switch, parent).lower_port,
                  tree.children(parent).index(switch), up.ip, up.mac, P.PASSING_UDP_PORT)
