"""The TNA program (p4src/tna/): a clear refusal without the open Tofino compiler or for a chip
it does not support; with the compiler (p4c-barefoot on PATH), it compiles for Tofino 2 within
the chip's resources, and the controller's entries for a job install on it as they do on the
v1model program: the same tables, keys, actions and parameters, by name and width."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable

import pytest

from controller import installer
from controller.switch import SwitchWriter, Update
from passing import protocol as P
from passing.control_surface import (
    CONTROL_COUNTERS,
    CONTROL_TABLES,
    control_surface,
    values_per_packet,
)
from passing.p4info import P4InfoIndex
from passing.pipeline_files import COMMITTED_P4INFO
from passing.tna_build import P4INFO_BIN, compile_program, resources
from testbed.entries import Uplink, job_entries
from tests import REPO

needs_bf_p4c = pytest.mark.skipif(
    shutil.which("p4c-barefoot") is None,
    reason="p4c-barefoot not on PATH (the open Tofino compiler is built from p4lang/p4c "
           "outside this repository; docs/tofino.md)")


def _tna_build(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "passing.tna_build", *args], cwd=REPO,
                          capture_output=True, text=True)


def test_without_the_compiler_the_build_says_what_is_missing(tmp_path):
    res = _tna_build("--p4c", "p4c-barefoot-that-does-not-exist", "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "'p4c-barefoot-that-does-not-exist' (the open Tofino compiler) is not on" \
        in res.stderr
    assert not (tmp_path / "o").exists()


def test_a_directory_that_is_no_build_is_never_overwritten(tmp_path):
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    res = _tna_build("--out", str(tmp_path))
    assert res.returncode == 2
    assert "is not empty and holds no earlier TNA build" in res.stderr
    assert keep.read_text() == "mine"


def test_tofino_1_is_refused_with_the_reason(tmp_path):
    res = _tna_build("--target", "tofino", "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "Tofino 1 is not a target of the TNA program" in res.stderr
    assert "16 stages of 4, beyond its 12" in res.stderr


def test_the_tna_slots_hold_the_controller_s_plan():
    """The controller plans SLOT_CAPACITY slots on every switch; both versions of each must
    have an entry under the 16-bit register index."""
    config = (REPO / "p4src" / "tna" / "config.p4").read_text()
    slots = int(re.search(r"^#define TNA_SLOTS (\d+)$", config, re.M)[1])
    assert P.SLOT_CAPACITY <= slots and 2 * slots <= 1 << 16
    assert re.search(r"^typedef bit<16> vidx_t;$", config, re.M)
    assert re.search(r"^#if PASSING_K != 64$", config, re.M)


@pytest.fixture(scope="module")
def tofino2(tmp_path_factory):
    return compile_program("tofino2", tmp_path_factory.mktemp("tna") / "tofino2")


@needs_bf_p4c
def test_the_program_fits_tofino_2(tofino2):
    res = resources("tofino2", tofino2)
    assert res.fits(), "\n".join(res.lines())
    # One ingress pass: the 32 value pairs and the slot's 8 state registers, one ALU each.
    assert res.stateful_alus[0] == 40
    assert res.egress_stages[0] <= 3


class _Recorder(SwitchWriter):
    """Takes the updates the installer writes, for one P4Info."""

    def __init__(self, name: str, info: P4InfoIndex):
        super().__init__(name, info)
        self.updates: list[Update] = []

    def write(self, updates: Iterable[Update]) -> None:
        self.updates.extend(updates)


def _by_name(info: P4InfoIndex, updates: list[Update]) -> list[tuple]:
    """The updates with every id replaced by the name it has in `info`."""
    out = []
    for u in updates:
        if u.entity.HasField("table_entry"):
            e = u.entity.table_entry
            table = next(t for t in info.p4info.tables if t.preamble.id == e.table_id)
            tname = table.preamble.name.split(".")[-1]
            fields = {f.id: f.name for f in table.match_fields}
            action = info.action_name(e.action.action.action_id)
            params = {p.id: p.name for p in info.action(action).params}
            out.append((u.type, tname,
                        sorted((fields[m.field_id], m.exact.value) for m in e.match),
                        action.split(".")[-1],
                        sorted((params[p.param_id], p.value) for p in e.action.action.params)))
        else:
            out.append((u.type, u.entity.SerializeToString()))
    return out


@needs_bf_p4c
def test_the_controller_s_entries_for_a_job_install_on_the_tna_program(tofino2):
    v1 = P4InfoIndex.from_file(COMMITTED_P4INFO)
    tna = P4InfoIndex.from_file(tofino2 / P4INFO_BIN)
    jobs = [
        # a root with two hosts and a guarded agent port each
        job_entries(0, 7, {1: 0, 2: 1}, pool_base=64, pool_size=256, gen=5, stat_idx=3),
        # a ToR below a spine: switch-only INA ranks behind a port, a quorum, an uplink
        job_entries(1, 9, {1: (0, 4), 3: (4, 4)}, pool_base=4000, pool_size=96, gen=6,
                    stat_idx=255, uplink=Uplink(port=9, contributor=2, spine_dev=2), quorum=6),
    ]
    on_v1, on_tna = _Recorder("v1model", v1), _Recorder("tna", tna)
    for d in jobs:
        installer.install(on_v1, d)
        installer.install(on_tna, d)
    written = _by_name(v1, on_v1.updates)
    assert written == _by_name(tna, on_tna.updates)
    tables = {u[1] for u in written if len(u) == 5}
    assert tables == {"job_config", "membership", "peer_rewrite", "result_guard"}
    assert sum(1 for u in written if len(u) == 2) == 2  # a multicast group per job


@needs_bf_p4c
def test_every_table_the_controller_uses_has_the_same_keys_and_actions(tofino2):
    v1 = P4InfoIndex.from_file(COMMITTED_P4INFO)
    tna = P4InfoIndex.from_file(tofino2 / P4INFO_BIN)

    # Each table's keys, actions, parameters and size, each counter's size and unit, by last
    # name (passing.control_surface): what a controller told the switch is "preloaded" checks
    # before it drives it (tests/controller/test_preloaded.py). The counters the controller
    # reads and zeroes (stats, a resize's pool retirement) are P4Runtime counters there too,
    # not Tofino externs (tna_build: --p4runtime-force-std-externs).
    ours, theirs = control_surface(v1.p4info), control_surface(tna.p4info)
    for name in (*CONTROL_TABLES, *CONTROL_COUNTERS):
        assert theirs[name] is not None and theirs[name] == ours[name], name
    assert not [e for e in tna.p4info.externs if e.extern_type_name == "Counter"]
    # And its K, which a preloaded switch's controller must share (PASSING_K=64 there).
    assert values_per_packet(tna.p4info) == 64
