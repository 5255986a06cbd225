"""The conformance suite runs every test against each switch target: `model` (the software switch,
always) and `bmv2` (simple_switch_grpc loaded with build/ over P4Runtime) whenever p4c and BMv2
are installed, skipped otherwise. Both are programmed over real P4Runtime and fed real frames on
veth interfaces."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from testbed.fabric import ROOT, Fabric

TARGETS = ["model", "bmv2"]


def skip_reason(target: str) -> str | None:
    if os.geteuid() != 0:
        return "data-plane tests need root (veth interfaces, raw sockets)"
    if target == "bmv2":
        missing = [b for b in ("p4c-bm2-ss", "simple_switch_grpc", "simple_switch_CLI")
                   if shutil.which(b) is None]
        if missing:
            return (f"BMv2 target: {', '.join(missing)} not on PATH (p4c/BMv2 come from no "
                    "package registry; see README, 'The P4 toolchain')")
    return None


@pytest.fixture(scope="session")
def built_pipeline() -> None:
    subprocess.run(["make", "-s", "build"], cwd=ROOT, check=True)


@pytest.fixture(params=TARGETS)
def target(request) -> str:
    reason = skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    if request.param == "bmv2":
        request.getfixturevalue("built_pipeline")
    return request.param


def _log_dir(tmp_path):
    return tmp_path if os.environ.get("PASSING_SWITCH_LOGS") else None


@pytest.fixture
def star(target, tmp_path):
    """One switch (device 0) with 5 test ports."""
    fabric = Fabric(target, {"s1": 5}, log_dir=_log_dir(tmp_path))
    yield fabric
    fabric.close()


@pytest.fixture
def two_level(target, tmp_path):
    """tor1 (device 0) and tor2 (device 1): ports 1-2 hosts, port 3 up to the spine (device 2)
    ports 1 and 2; spine port 3 is a test port (unused by jobs)."""
    fabric = Fabric(target, {"tor1": 3, "tor2": 3, "spine": 3},
                    links=[(("tor1", 3), ("spine", 1)), (("tor2", 3), ("spine", 2))],
                    log_dir=_log_dir(tmp_path))
    yield fabric
    fabric.close()
