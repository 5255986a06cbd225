"""A switch whose own tools load its program (`"pipeline": "preloaded"`, as Tofino's bf_switchd
does): the controller never pushes a pipeline there. It drives a program whose tables and
counters are PASSING's even when that program's P4Info numbers them its own way, as another
compiler does, and refuses, saying why and loading nothing, a switch that runs nothing or
something else.

The switch is the model's P4Runtime service in this process, started with a P4Info of its own:
that is what a switch loaded by other tools answers the controller. No root."""

from __future__ import annotations

import json

import pytest
from p4.config.v1 import p4info_pb2

from controller.cli import main
from controller.core import Controller, ControllerError, Endpoint
from controller.job_plan import JobSpec
from controller.topology import load
from passing import protocol as P
from passing.control_surface import control_surface, surface_difference, values_per_packet
from passing.pipeline_files import committed_p4info
from switch_model.p4runtime_server import P4RuntimeService, listen
from switch_model.pipeline import Pipeline
from tests import REPO


def renumbered(info: p4info_pb2.P4Info) -> p4info_pb2.P4Info:
    """`info` with every table, action and counter id changed (kind prefix kept), as another
    compiler of the same program would number them."""
    out = p4info_pb2.P4Info()
    out.CopyFrom(info)
    new = {}
    for item in [*out.tables, *out.actions, *out.counters, *out.registers]:
        old = item.preamble.id
        item.preamble.id = new[old] = old + 0x100
        assert new[old] >> 24 == old >> 24
    for t in out.tables:
        for ref in t.action_refs:
            ref.id = new[ref.id]
    assert len(set(new.values())) == len(new)
    return out


class LoadedSwitch:
    """The model's P4Runtime service running `runs` (None: no program) as loaded at start."""

    def __init__(self, runs: p4info_pb2.P4Info | None):
        own = committed_p4info()
        self.service = P4RuntimeService(Pipeline.from_p4info(own), 0, runs or own,
                                        preloaded=runs is not None)
        self.server, port = listen(self.service, "127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def loaded(tmp_path):
    made: list = []

    def make(runs: p4info_pb2.P4Info | None, preloaded: bool = True):
        sw = LoadedSwitch(runs)
        ctl = Controller(load(REPO / "topologies" / "star.json"),
                         {"s1": Endpoint("s1", sw.address, 0, preloaded=preloaded)},
                         tmp_path / f"state{len(made)}.sqlite", connect_timeout=2, retries=1)
        made.append((ctl, sw))
        return ctl, sw
    yield make
    for ctl, sw in made:
        ctl.close()
        sw.close()


def test_a_program_numbered_its_own_way_is_driven_and_never_replaced(loaded):
    runs = renumbered(committed_p4info())
    ctl, sw = loaded(runs)
    assert ctl.switch_status()[0]["pipeline"] == "ours"
    assert ctl.prepare("s1") == "kept"
    ctl.create_job(JobSpec(7, ("h1", "h2"), window=32))
    # The entries went in under the switch's own ids, and its program is still the one loaded.
    conn = ctl.connections.conn("s1")
    assert conn.info.p4info == runs
    assert [r["match"]["job_id"] for r in conn.read_table("job_config")] == [7]
    assert len(conn.read_table("membership")) == 2
    # Its counters too: stats reads them (and a resize's retirement) by the switch's ids.
    stats = ctl.stats(7)["s1"]
    assert "error" not in stats and stats["job_contributions"] == 0


def test_the_same_switch_without_preloaded_would_be_replaced(loaded):
    """Why the setting exists: by exact P4Info the controller calls that program another one
    (and `prepare` would push its own over it)."""
    ctl, _ = loaded(renumbered(committed_p4info()), preloaded=False)
    assert ctl.switch_status()[0]["pipeline"] == "other"


def test_a_switch_that_runs_nothing_is_refused_and_left_as_it_is(loaded):
    ctl, sw = loaded(None)
    with pytest.raises(ControllerError, match=r"switch s1 runs no pipeline, and its "
                       r"configuration says \"pipeline\": \"preloaded\".*load the PASSING "
                       r"program with the switch's own tools"):
        ctl.prepare("s1")
    with pytest.raises(ControllerError, match="runs no pipeline"):
        ctl.create_job(JobSpec(7, ("h1", "h2"), window=32))
    assert not sw.service.loaded
    assert ctl.store.get_job(7) is None


def test_a_switch_that_runs_another_program_is_refused_naming_the_difference(loaded):
    other = renumbered(committed_p4info())
    table = next(t for t in other.tables if t.preamble.name.endswith("membership"))
    table.match_fields[1].bitwidth = 16  # the ingress port, as another program may have it
    ctl, sw = loaded(other)
    with pytest.raises(ControllerError, match=r"switch s1 runs a program the controller cannot "
                       r"drive \(its table membership differs in keys, actions or size\)"):
        ctl.prepare("s1")
    assert ctl.connections.conn("s1").read_table("job_config") == []


def test_a_program_of_another_k_is_refused_naming_the_k_to_run_with(loaded):
    """Same tables and counters, another K: every packet of this K would fail that program's
    length check and every call time out. The controller says so before it writes anything."""
    other_k = 64 if P.K != 64 else 128
    other = renumbered(committed_p4info(other_k))
    assert values_per_packet(other) == other_k
    ctl, _ = loaded(other)
    assert ctl.switch_status()[0]["pipeline"] == "other"
    with pytest.raises(ControllerError, match=rf"it sums K={other_k} values per packet, this "
                       rf"controller K={P.K}: run the controller and every agent with "
                       rf"PASSING_K={other_k}"):
        ctl.create_job(JobSpec(7, ("h1", "h2"), window=32))
    assert ctl.connections.conn("s1").read_table("job_config") == []
    assert ctl.store.get_job(7) is None


def test_k_is_read_from_either_program_s_value_registers():
    assert values_per_packet(committed_p4info()) == P.K
    assert [values_per_packet(committed_p4info(k)) for k in P.K_CHOICES] == list(P.K_CHOICES)
    tna = p4info_pb2.P4Info()
    for n in range(32):  # p4src/tna/slot_values.p4: 32 registers of two lanes, K = 64
        tna.registers.add().preamble.name = f"pipe.SwitchIngress.slot_values_{n}"
    assert values_per_packet(tna) == 64
    assert values_per_packet(p4info_pb2.P4Info()) is None


def test_surface_difference_names_what_is_missing():
    other = p4info_pb2.P4Info()
    other.CopyFrom(committed_p4info())
    del other.counters[:]
    ours = control_surface(committed_p4info())
    assert surface_difference(ours, other) == "it has no counter global_drops"
    assert surface_difference(ours, renumbered(committed_p4info())) is None


def test_the_configuration_says_which_settings_exist(tmp_path, capsys):
    cfg = {"topology": str(REPO / "topologies" / "star.json"), "state": "state.sqlite",
           "switches": {"s1": {"address": "127.0.0.1:1", "device_id": 0,
                               "pipeline": "tofino"}}}
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(cfg))
    assert main(["--config", str(path), "switches"]) == 3  # bad configuration
    err = capsys.readouterr().err
    assert "switches.s1.pipeline is 'tofino': \"push\"" in err
    assert "\"preloaded\" (the switch's own tools load it, as on Tofino" in err


@pytest.mark.parametrize("runs, status", [
    (lambda: renumbered(committed_p4info()), "pipeline loaded (preloaded)"),
    (lambda: None, "no pipeline (preloaded: load PASSING's with the switch's own tools)"),
])
def test_switches_says_which_switches_load_their_own_program(tmp_path, capsys, runs, status):
    sw = LoadedSwitch(runs())
    try:
        cfg = {"topology": str(REPO / "topologies" / "star.json"), "state": "state.sqlite",
               "switches": {"s1": {"address": sw.address, "device_id": 0,
                                   "pipeline": "preloaded"}}}
        path = tmp_path / "controller.json"
        path.write_text(json.dumps(cfg))
        assert main(["--config", str(path), "switches"]) == 0
        assert status in capsys.readouterr().out
        assert main(["--config", str(path), "switches", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)[0]
        assert row["preloaded"] is True and row["reachable"] is True
    finally:
        sw.close()
