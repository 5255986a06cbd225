"""`make build`: a clear refusal without p4c; with p4c, the program compiles to exactly the
P4Info that is committed (which the model and the controller use) and to the defaults the
model assumes, at this process's K; and every other K compiles to the same program but for the
values' width and the size of slot_values."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from passing import protocol as P
from passing.p4info import P4InfoIndex, pipeline_signature, sized_for_k
from passing.pipeline_files import COMMITTED_P4INFO, built_k, committed_p4info
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
    assert built_k(out / f"k{P.K}") == P.K
    return out / f"k{P.K}"


@needs_p4c
def test_program_compiles_to_the_committed_p4info(build):
    built = P4InfoIndex.from_file(build / "passing.p4info.txtpb").p4info
    committed = P4InfoIndex.from_file(COMMITTED_P4INFO).p4info
    assert pipeline_signature(built) == pipeline_signature(committed_p4info()), \
        "p4src/ changed: run `make update-p4info` (with PASSING_K unset)"
    # The committed file itself is the default K's build.
    assert pipeline_signature(sized_for_k(built, P.DEFAULT_K)) == pipeline_signature(committed)


def values_fields(bmv2: dict) -> list:
    return next(h["fields"] for h in bmv2["header_types"] if h["name"] == "values_t")


def aggregate_primitives(bmv2: dict) -> list[str]:
    """The primitives of the Aggregation control's actions (load, place, decide, commit)."""
    actions = [a for a in bmv2["actions"] if ".aggregation." in a["name"]]
    assert sorted(a["name"].rsplit(".", 1)[1] for a in actions) == \
        ["commit", "decide", "load", "place"]
    return [p["op"] for a in actions for p in a["primitives"]]


@needs_p4c
@pytest.mark.parametrize("k", [k for k in P.K_CHOICES if k != P.K])
def test_every_other_k_builds_the_same_program_wider(build, tmp_path, k):
    """PASSING_K=k python -m passing.p4build: the values header and slot_values grow by whole
    2048-bit words, the aggregation keeps its four actions with one more register read and
    write per word, and the P4Info differs in slot_values' size only."""
    env = dict(os.environ, PASSING_K=str(k), PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "passing.p4build", "--out", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"for K={k}" in res.stdout and built_k(tmp_path) == k
    info = P4InfoIndex.from_file(tmp_path / "passing.p4info.txtpb")
    assert pipeline_signature(info.p4info) == pipeline_signature(committed_p4info(k))
    assert info.register("slot_values").size == 2 * P.SLOT_CAPACITY * k // 64
    wide, here = (json.loads((d / "passing.json").read_text()) for d in (tmp_path, build))
    assert values_fields(wide) == [[f"w{w}", 2048, False] for w in range(k // 64)]
    assert values_fields(here) == [[f"w{w}", 2048, False] for w in range(P.VALUE_WORDS)]
    ops_wide, ops_here = aggregate_primitives(wide), aggregate_primitives(here)
    extra = k // 64 - P.VALUE_WORDS
    assert ops_wide.count("register_read") - ops_here.count("register_read") == extra
    assert ops_wide.count("register_write") - ops_here.count("register_write") == extra
    # No tables or conditions added: BMv2's per-packet cost grows only inside the actions.
    assert [len(p["tables"]) for p in wide["pipelines"]] == \
        [len(p["tables"]) for p in here["pipelines"]]
    assert [len(p["conditionals"]) for p in wide["pipelines"]] == \
        [len(p["conditionals"]) for p in here["pipelines"]]


@needs_p4c
def test_a_k_p4c_cannot_build_is_refused_by_the_program(tmp_path):
    res = subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "-DPASSING_K=96", "-o",
                          str(tmp_path / "x.json"), str(Path(REPO) / "p4src" / "passing.p4")],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "PASSING_K must be 64, 128, 256, 320 or 2048" in res.stderr


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
    assert info.register("slot_state").type_spec.bitstring.bit.bitwidth == 368
    assert info.register("slot_values").type_spec.bitstring.bit.bitwidth == 2048
    assert info.register("slot_values").size == 2 * P.SLOT_CAPACITY * P.VALUE_WORDS
    assert info.counter("job_stats").size == 256 * 32
    assert info.counter("late_contribs").size == 256 * P.MAX_FAN_IN
    assert sorted(info.names("table")) == ["job_config", "l2_forward", "membership",
                                           "peer_rewrite", "result_guard"]
