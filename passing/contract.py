"""The job parameters the controller hands to host agents: one typed, versioned contract.

`passing-ctl` produces a JobParams for each job (`passing-ctl job show ID --json`, under
"agent_params"; `job create --params-out FILE`); every agent reads it through `JobParams` and
nothing else, so that a field is named once, checked once, and a file written for another
version of the contract is refused with a message instead of being misread.

Only what some agent reads is sent. Derived quantities (the number of contributions the
switches sum, the hosts' ids and ports) are properties, not fields, so that they can never
disagree with the fields they come from. No torch here: the controller imports this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from passing import protocol as P
from passing.host_params import HostParams, ParamsError, check_int

FORMAT_VERSION = 1
MODES = ("passing", "ina")
# The keys of the untyped dict agents read before FORMAT_VERSION 1 existed.
_LEGACY_KEYS = frozenset({"udp_port", "agent_port", "slots", "hosts_total", "streams", "k",
                          "scale_bits", "contributors_total"})


MAX_STALENESS = 1 << 20


def parse_patience(text: str) -> tuple[float, ...]:
    """"P" or "MIN..MAX" seconds as a patience tuple (check_patience); ValueError if not."""
    value = tuple(float(x) for x in text.split("..", 1))
    check_patience(value)
    return value


def check_patience(patience: tuple[float, ...]) -> None:
    """(P,) fixed, (MIN, MAX) adaptive with MIN <= MAX, or () none; seconds, positive and
    finite. Raises ValueError naming what is wrong."""
    ok = isinstance(patience, tuple) and len(patience) <= 2 and all(
        isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < float("inf")
        for x in patience)
    if not ok or (len(patience) == 2 and patience[0] > patience[1]):
        shown = list(patience) if isinstance(patience, tuple) else repr(patience)
        raise ValueError(f"patience {shown}: [] (rounds wait for everyone), [P] seconds, or "
                         "[MIN, MAX] seconds (adaptive), each positive and finite, MIN <= MAX")


@dataclass(frozen=True)
class JobParams:
    """Everything a host agent needs to join a job (docs/controller.md, "Host agents'
    parameters")."""

    job_id: int
    mode: str  # "passing": one stream per host; "ina": one per GPU rank (job_plan)
    # The job's secret (hex) keying the hosts' session rendezvous (host_agent.session); ""
    # for jobs created before keys existed: their sessions are unkeyed.
    session_key: str
    switch_udp_port: int  # where the switches receive contributions
    agent_udp_port: int  # where an agent receives results; in `ina`, local rank i on + i
    # The job's slots per switch: packets each stream keeps in flight. 0: the switches hold
    # no pool for the job yet (it waits for slots): its hosts sum with a host collective
    # (host_agent.host_collective) and move onto the switches when a pool comes.
    window: int
    hosts: tuple[HostParams, ...]
    # K of the controller that wrote them, which is its switches' (PASSING_K, one number per
    # deployment). Optional in a file: files written before the field existed carry none.
    values_per_packet: int = P.K
    # The job's quorum policy for agents (controller.job_plan.JobSpec): seconds a round
    # waits before a host asks to close it ((P,) fixed, (MIN, MAX) adaptive, () never), and
    # calls in a row that may leave some GPU out. Optional in a file (older ones have none).
    patience: tuple[float, ...] = ()
    staleness: int = 1
    # How many times the job's pool was resized (`passing-ctl job resize`): the window above is
    # that pool's, and its low bit is the FLAG_POOL the job's packets carry (docs/protocol.md,
    # "Live pool resizing"). Optional in a file (older ones have none: 0).
    pool: int = 0
    # How many times `passing-ctl job set` changed the patience or staleness above: agents
    # that learn of a newer one while they run change to it after the same call (docs/
    # protocol.md, "Live policy changes"). Optional in a file (older ones have none: 0).
    policy: int = 0

    def __post_init__(self) -> None:
        check_int("job_id", self.job_id, 1, 0xFFFF)
        check_int("pool", self.pool, 0, 0x7FFFFFFF)
        check_int("policy", self.policy, 0, 0x7FFFFFFF)
        try:
            check_patience(self.patience)
        except ValueError as e:
            raise ParamsError(str(e)) from None
        check_int("staleness", self.staleness, 0, MAX_STALENESS)
        if self.values_per_packet != P.K:
            raise ParamsError(
                f"values_per_packet: the job's switches take {self.values_per_packet!r} values "
                f"per packet, this process {P.K}: run the agents with "
                f"PASSING_K={self.values_per_packet}, as the controller and the P4 build were, "
                "or every packet is dropped as malformed")
        if self.mode not in MODES:
            raise ParamsError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        try:
            bytes.fromhex(self.session_key)
        except (ValueError, TypeError):
            raise ParamsError("session_key: not a hexadecimal string of whole bytes") from None
        check_int("switch_udp_port", self.switch_udp_port, 1, 0xFFFF)
        check_int("agent_udp_port", self.agent_udp_port, 1, 0xFFFF)
        check_int("window", self.window, 0, P.SLOT_CAPACITY)
        if not isinstance(self.hosts, tuple) or not all(isinstance(h, HostParams)
                                                         for h in self.hosts):
            raise ParamsError("hosts: must be a tuple of HostParams")
        if not self.hosts:
            raise ParamsError("hosts: a job has at least one host")
        names = [h.name for h in self.hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ParamsError(f"hosts: listed twice: {', '.join(twice)}")
        top = max(self.agent_udp_ports(h.name).stop - 1 for h in self.hosts)
        if top > 0xFFFF:
            raise ParamsError(f"agent_udp_port: {self.agent_udp_port} + local ranks reaches "
                              f"{top}, beyond 65535")
        self._check_contributor_ids()

    def _check_contributor_ids(self) -> None:
        """At each ToR the switch admits exactly the ids 0..n-1, one stream each; ids that
        overlap or leave a gap would make two hosts one contributor, or the switch wait
        forever for one that does not exist."""
        by_switch: dict[str, list[HostParams]] = {}
        for h in self.hosts:
            by_switch.setdefault(h.switch_ip, []).append(h)
        for switch_ip, hosts in by_switch.items():
            owner: dict[int, str] = {}
            for h in hosts:
                for cid in self.contributor_ids(h.name):
                    if cid in owner:
                        raise ParamsError(
                            f"hosts.{h.name}.contributor_id: id {cid} at switch {switch_ip} "
                            f"is also {owner[cid]}'s")
                    owner[cid] = h.name
            missing = sorted(set(range(len(owner))) - set(owner))
            if missing:
                raise ParamsError(
                    f"hosts.*.contributor_id: the ids at switch {switch_ip} are not 0..n-1 "
                    f"(missing {', '.join(map(str, missing))})")
            if len(owner) > P.MAX_FAN_IN:
                raise ParamsError(f"hosts.*.contributor_id: {len(owner)} contributors at switch "
                                  f"{switch_ip}, at most {P.MAX_FAN_IN}")

    # -- what agents derive ---------------------------------------------------------------------
    @property
    def host_names(self) -> list[str]:
        """The hosts in the order every agent numbers them (host index 0 serves the session
        rendezvous)."""
        return sorted(h.name for h in self.hosts)

    def host(self, name: str) -> HostParams:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ParamsError(f"host {name} is not in job {self.job_id} "
                          f"(hosts: {', '.join(self.host_names)})")

    def host_index(self, name: str) -> int:
        self.host(name)
        return self.host_names.index(name)

    def streams_of(self, name: str) -> int:
        """How many streams host `name` sends: its GPUs in `ina`, one in `passing`."""
        return self.host(name).local_gpus if self.mode == "ina" else 1

    def contributor_ids(self, name: str) -> range:
        first = self.host(name).contributor_id
        return range(first, first + self.streams_of(name))

    def agent_udp_ports(self, name: str) -> range:
        """The ports host `name`'s ranks receive results on (stream i on the i-th)."""
        return range(self.agent_udp_port, self.agent_udp_port + self.streams_of(name))

    @property
    def streams(self) -> int:
        """The contributions the switches sum: hosts in `passing`, GPUs in `ina` (the agents'
        fixed-point headroom, host_agent.fixed_point.scale_bits)."""
        return sum(self.streams_of(h.name) for h in self.hosts)

    @property
    def gpus(self) -> int:
        """Every local rank of every host: the contributions a result sums, in either mode."""
        return sum(h.local_gpus for h in self.hosts)

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = self._fields()
        if not self.policy:
            # Left out until a `job set` raises it, so agents of the release before it, which
            # refuse unknown fields, still read a job nobody has changed.
            del d["policy"]
        return d

    def _fields(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "job_id": self.job_id, "mode": self.mode,
                "session_key": self.session_key, "switch_udp_port": self.switch_udp_port,
                "agent_udp_port": self.agent_udp_port, "window": self.window,
                "values_per_packet": self.values_per_packet,
                "patience": list(self.patience), "staleness": self.staleness,
                "pool": self.pool, "policy": self.policy,
                "hosts": {h.name: h.to_dict() for h in self.hosts}}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Any) -> JobParams:
        if not isinstance(d, dict):
            raise ParamsError(f"agent parameters: a JSON object, not {type(d).__name__}")
        regenerate = (f"regenerate them with `passing-ctl job show {d.get('job_id', 'ID')} "
                      "--json | jq .agent_params` (the job itself need not change)")
        if "version" not in d:
            old = sorted(_LEGACY_KEYS & set(d))
            what = f" (keys {', '.join(old)})" if old else ""
            raise ParamsError(f"agent parameters in the format before version {FORMAT_VERSION}"
                              f"{what}, which agents no longer read: {regenerate}")
        if type(d["version"]) is not int or d["version"] != FORMAT_VERSION:  # true == 1
            raise ParamsError(f"version: agent parameters of format {d['version']!r}, this "
                              f"agent reads format {FORMAT_VERSION}: {regenerate} with the "
                              "controller of the same PASSING version as the agents")
        top = {f.name for f in fields(cls)}
        optional = {"values_per_packet", "patience", "staleness", "pool", "policy"} - set(d)
        _check_keys("", d, top - optional | {"version"})
        if not isinstance(d["hosts"], dict):
            raise ParamsError("hosts: a JSON object of host name -> parameters")
        host_keys = {f.name for f in fields(HostParams)} - {"name"}
        hosts = []
        for name, h in d["hosts"].items():
            if not isinstance(h, dict):
                raise ParamsError(f"hosts.{name}: a JSON object, not {type(h).__name__}")
            _check_keys(f"hosts.{name}.", h, host_keys)
            hosts.append(HostParams(name, **h))
        given = {k: d[k] for k in top - {"hosts"} - optional}
        if isinstance(given.get("patience"), list):
            given["patience"] = tuple(given["patience"])
        return cls(**given, hosts=tuple(hosts))

    @classmethod
    def from_json(cls, text: str) -> JobParams:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParamsError(f"agent parameters: not JSON ({e})") from None
        return cls.from_dict(doc)

    @classmethod
    def load(cls, path: str | Path) -> JobParams:
        """The parameters in file `path`; an unreadable file is a ParamsError too."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ParamsError(f"cannot read {path}: {e.strerror}") from None
        return cls.from_json(text)


def _check_keys(where: str, d: dict, want: set[str]) -> None:
    missing, unknown = sorted(want - set(d)), sorted(set(d) - want)
    if missing:
        raise ParamsError(f"{where}{missing[0]}: missing" if len(missing) == 1 else
                          f"{where}{{{', '.join(missing)}}}: missing")
    if unknown:
        raise ParamsError(f"{where}{', '.join(unknown)}: unknown field(s) of format "
                          f"{FORMAT_VERSION}")
