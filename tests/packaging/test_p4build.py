"""passing.p4build, the one build step of `make build`, the topology runner and the tests:
like make, it compiles only when a P4 source is newer than the build or the build is for another
K, and without p4c it says what is missing instead of failing somewhere later. A build is never
used with another K."""

from __future__ import annotations

import os
import shutil

import pytest

from passing import p4build
from passing import protocol as P
from passing.pipeline_files import BUILD_DIR, BUILD_ROOT, K_STAMP, BuildMismatch, p4_sources
from passing.pipeline_files import pipeline_files as files_of

NO_P4C = "p4c-that-does-not-exist"


def fake_build(out, age_s: float, k: int = P.K) -> None:
    """Outputs for `k`, `age_s` seconds older (negative: newer) than the newest P4 source."""
    newest = max(p.stat().st_mtime for p in p4_sources())
    out.mkdir(parents=True, exist_ok=True)
    for name in ("passing.json", "passing.p4info.txtpb"):
        (out / name).write_text("{}" if name.endswith("json") else "")
        os.utime(out / name, (newest - age_s, newest - age_s))
    (out / K_STAMP).write_text(f"{k}\n")


def test_a_build_newer_than_every_source_is_kept_without_p4c(tmp_path):
    fake_build(tmp_path, age_s=-10)
    assert p4build.up_to_date(tmp_path)
    assert p4build.build(tmp_path, p4c=NO_P4C) is False


@pytest.mark.parametrize("state", ["stale", "missing"])
def test_a_stale_or_missing_build_needs_p4c_and_says_so(tmp_path, state):
    if state == "stale":
        fake_build(tmp_path, age_s=10)
    assert not p4build.up_to_date(tmp_path)
    with pytest.raises(p4build.P4cMissing, match=f"'{NO_P4C}' \\(the p4c BMv2 backend\\) is "
                                                 "not on PATH"):
        p4build.build(tmp_path, p4c=NO_P4C)


@pytest.mark.parametrize("stamp", ["other", "missing"])
def test_a_build_for_another_or_an_unknown_k_is_rebuilt_and_never_pushed(tmp_path, stamp):
    other = next(k for k in P.K_CHOICES if k != P.K)
    fake_build(tmp_path, age_s=-10, k=other)
    if stamp == "missing":
        (tmp_path / K_STAMP).unlink()
    assert not p4build.up_to_date(tmp_path)
    with pytest.raises(p4build.P4cMissing):
        p4build.build(tmp_path, p4c=NO_P4C)
    said = other if stamp == "other" else "unknown"
    with pytest.raises(BuildMismatch, match=f"built for K={said}, but PASSING_K gives K={P.K}"):
        files_of(tmp_path)


def test_a_build_older_than_a_source_is_never_pushed(tmp_path):
    """BMv2 would run the program as it was built, not as the agents now speak it."""
    fake_build(tmp_path, age_s=10)
    newest = max(p4_sources(), key=lambda p: p.stat().st_mtime)
    with pytest.raises(BuildMismatch, match=f"built before {newest} last changed: rebuild it"):
        files_of(tmp_path)
    fake_build(tmp_path, age_s=-10)
    assert files_of(tmp_path)[1] == b"{}"


def test_each_k_has_its_own_build_directory():
    assert BUILD_DIR == BUILD_ROOT / f"k{P.K}"


def test_main_exits_2_with_the_message(tmp_path, capsys):
    assert p4build.main(["--out", str(tmp_path), "--p4c", NO_P4C]) == 2
    assert "p4c is in no package registry" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which(p4build.P4C) is None,
                    reason="p4c-bm2-ss not on PATH (p4c comes from no package registry)")
def test_compiles_once_then_keeps_the_build(tmp_path):
    assert p4build.build(tmp_path) is True
    assert (tmp_path / "passing.json").stat().st_size > 0
    assert (tmp_path / K_STAMP).read_text() == f"{P.K}\n"
    assert files_of(tmp_path)[1] == (tmp_path / "passing.json").read_bytes()
    assert p4build.build(tmp_path) is False
    assert p4build.build(tmp_path, force=True) is True
