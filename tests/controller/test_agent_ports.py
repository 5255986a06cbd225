"""Agent port ranges on their own (controller.agent_ports.AgentPorts): a state file and a
topology, no switch. What a user sees: a range that overlaps another job's is refused naming
that job, and a job without --agent-port gets the lowest range nobody uses or guards."""

from __future__ import annotations

import re

import pytest

from controller.agent_ports import AgentPorts, port_span
from controller.errors import ControllerError
from controller.installer import SwitchSnapshot
from controller.job_plan import JobSpec
from controller.records import JobRecord, PoolRecord
from controller.store import JobStore
from controller.topology import load
from passing import protocol as P
from tests import REPO

TOPO = load(REPO / "topologies" / "star.json")  # one switch s1; 4 hosts of 2 GPUs


@pytest.fixture
def store(tmp_path):
    with JobStore(tmp_path / "state.sqlite") as s:
        yield s


def record(store: JobStore, job_id: int, agent_port: int, mode: str = "passing",
           stat_idx: int = 0) -> None:
    """Job `job_id` on h1 and h2 as the state file holds it once created."""
    spec = JobSpec(job_id, ("h1", "h2"), window=8, agent_port=agent_port, mode=mode)
    store.add_job(JobRecord(job_id, spec.to_dict(),
                            (PoolRecord("s1", 8 * stat_idx, 8, job_id, stat_idx, 2 + stat_idx,
                                        2, True, 0),), 0.0))


def guarding(*ports: int) -> dict[str, SwitchSnapshot]:
    """s1 as read back when it guards `ports` for no job of the state file."""
    return {"s1": SwitchSnapshot({}, {}, {}, {}, {p: 7 for p in ports})}


def test_an_explicit_range_that_overlaps_another_job_is_refused_naming_it(store):
    record(store, 7, 61000, mode="ina")  # 61000-61001
    ports = AgentPorts(TOPO, store)
    with pytest.raises(ControllerError) as e:
        ports.resolve(JobSpec(8, ("h3", "h4"), window=8, agent_port=61001, mode="ina"), {})
    assert str(e.value) == ("job 8: agent ports 61001-61002 overlap job 7's agent ports "
                            "61000-61001; pass another --agent-port, or none to get a free range")


def test_a_free_explicit_range_is_kept(store):
    record(store, 7, 61000)
    spec = JobSpec(8, ("h3",), window=8, agent_port=61001)
    assert AgentPorts(TOPO, store).resolve(spec, {}) == spec


@pytest.mark.parametrize(("port", "mode", "why"), [
    (65535, "ina", "run past 65535 (2 ports, one per GPU of a host)"),
    (P.PASSING_UDP_PORT, "passing", f"include {P.PASSING_UDP_PORT}, the switches' aggregation "
                                    "port"),
    (61002, "passing", "include port 61002, which switch s1 guards for no known job"),
])
def test_ports_no_job_may_have_are_refused(store, port, mode, why):
    spec = JobSpec(8, ("h3", "h4"), window=8, agent_port=port, mode=mode)
    with pytest.raises(ControllerError, match=f"^job 8: agent ports [0-9-]+ {re.escape(why)}"):
        AgentPorts(TOPO, store).resolve(spec, guarding(61002))


def test_without_a_port_the_lowest_range_nobody_uses_or_guards_is_taken(store):
    record(store, 7, 61000)
    ports = AgentPorts(TOPO, store)
    # 61000 is job 7's and 61001 a stray guard: two ports in a row start at 61002.
    got = ports.resolve(JobSpec(8, ("h3", "h4"), window=8, mode="ina"), guarding(61001))
    assert got.agent_port == 61002
    assert ports.clash(8, got.agent_ports(TOPO)) is None
    assert ports.clash(8, range(61000, 61002)) == "overlap job 7's agent ports 61000"


def test_a_port_two_old_records_share_is_guarded_by_the_lower_job_id(store):
    # Records from before ports were allocated (agent_port 0) may share one.
    record(store, 20001, 0, stat_idx=1)  # 40000 + 20001 % 20000 = 40001
    record(store, 1, 0, stat_idx=0)  # 40001 too
    claims = AgentPorts(TOPO, store).guard_claims()
    assert claims[("s1", 40001)] == [(1, 0), (20001, 1)]


def test_port_span_reads_as_operators_write_ranges():
    assert (port_span(range(61000, 61001)), port_span(range(61000, 61004))) == \
        ("61000", "61000-61003")
