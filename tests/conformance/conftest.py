"""The conformance suite runs every test against each switch target: `model` (the software switch,
always) and `bmv2` (simple_switch_grpc loaded with build/ over P4Runtime) whenever p4c and BMv2
are installed, skipped otherwise. Both are programmed over real P4Runtime and fed real frames on
veth interfaces."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from passing.pipeline_files import REPO as ROOT
from testbed.fabric import Fabric

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


def _log_dir(factory) -> object:
    return factory.mktemp("switch-logs") if os.environ.get("PASSING_SWITCH_LOGS") else None


# Switch processes are started once per target and session; each test gets them reset (pipeline
# pushed again: tables, counters, registers empty), which is what a fresh start gives, faster.
_fabrics: dict[tuple[str, str], Fabric] = {}


def _fabric(kind: str, target: str, factory) -> Fabric:
    key = (kind, target)
    if key not in _fabrics:
        if kind == "star":
            _fabrics[key] = Fabric(target, {"s1": 5}, log_dir=_log_dir(factory))
        else:
            _fabrics[key] = Fabric(target, {"tor1": 3, "tor2": 3, "spine": 3},
                                   links=[(("tor1", 3), ("spine", 1)), (("tor2", 3), ("spine", 2))],
                                   log_dir=_log_dir(factory))
    fabric = _fabrics[key]
    fabric.reset()
    return fabric


@pytest.fixture(scope="session", autouse=True)
def _close_fabrics():
    yield
    for fabric in _fabrics.values():
        fabric.close()
    _fabrics.clear()


@pytest.fixture
def star(target, tmp_path_factory):
    """One switch (device 0) with 5 test ports."""
    return _fabric("star", target, tmp_path_factory)


@pytest.fixture
def two_level(target, tmp_path_factory):
    """tor1 (device 0) and tor2 (device 1): ports 1-2 hosts, port 3 up to the spine (device 2)
    ports 1 and 2; spine port 3 is a test port (unused by jobs)."""
    return _fabric("two_level", target, tmp_path_factory)
