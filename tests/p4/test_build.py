"""`make build`: a clear refusal without p4c; with p4c, the program compiles to exactly the
P4Info that is committed (which the model and the controller use) and to the defaults the
model assumes."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from passing.p4info import P4InfoIndex, pipeline_signature
from passing.pipeline_files import COMMITTED_P4INFO
from switch_model.pipeline import INITIAL_DEFAULTS
from tests import REPO

needs_p4c = pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None,
                               reason="p4c-bm2-ss not on PATH (p4c comes from no package "
                                      "registry; see README, 'The P4 toolchain')")


def test_make_build_without_p4c_says_so(tmp_path):
    res = subprocess.run(["make", "-s", "build", "P4C=p4c-that-does-not-exist",
                          f"BUILD={tmp_path}"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode != 0
    assert "'p4c-that-does-not-exist' (the p4c BMv2 backend) is not on PATH" in res.stdout
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    res = subprocess.run(["make", "-s", "build", f"BUILD={out}"], cwd=REPO, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


@needs_p4c
def test_program_compiles_to_the_committed_p4info(build):
    built = P4InfoIndex.from_file(build / "passing.p4info.txtpb").p4info
    committed = P4InfoIndex.from_file(COMMITTED_P4INFO).p4info
    assert pipeline_signature(built) == pipeline_signature(committed), \
        "p4src/ changed: copy build/passing.p4info.txtpb to p4src/passing.p4info.txtpb"


@needs_p4c
def test_table_defaults_are_the_ones_the_model_assumes(build):
    bmv2 = json.loads((build / "passing.json").read_text())
    actions = {a["id"]: a["name"] for a in bmv2["actions"]}
    defaults = {}
    for pipe in bmv2["pipelines"]:
        for t in pipe["tables"]:
            if t["name"].startswith("tbl_"):
                continue  # tables p4c makes for straight-line code, not controller-visible
            entry = t["default_entry"]
            defaults[t["name"].lstrip(".")] = (actions[entry["action_id"]].lstrip("."),
                                               entry["action_data"])
    assert {name: (a.name, []) for name, a in INITIAL_DEFAULTS.items()} == defaults


@needs_p4c
def test_registers_and_counters_have_the_documented_shapes(build):
    info = P4InfoIndex.from_file(build / "passing.p4info.txtpb")
    assert info.register("slot_state").type_spec.bitstring.bit.bitwidth == 240
    assert info.register("slot_values").type_spec.bitstring.bit.bitwidth == 2048
    assert info.counter("job_stats").size == 256 * 16
    assert sorted(info.names("table")) == ["job_config", "l2_forward", "membership",
                                           "peer_rewrite", "result_guard"]
