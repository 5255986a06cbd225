"""Fixtures shared by the tests that run switches: the `target` parameter (`model` always, `bmv2`
when p4c and BMv2 are installed, skipped with the reason otherwise) and a cache of switch
fabrics, started once per target and layout, reset before each test."""

from __future__ import annotations

import os
import shutil

import pytest

from passing import p4build
from testbed.fabric import Fabric

TARGETS = ["model", "bmv2"]

# layout name -> (switches with their port counts, switch-to-switch links)
LAYOUTS = {
    "star": ({"s1": 5}, []),
    "two_level": ({"tor1": 3, "tor2": 3, "spine": 3},
                  [(("tor1", 3), ("spine", 1)), (("tor2", 3), ("spine", 2))]),
    # Hosts -> ToRs -> spines -> core: tor1 and tor2 under spine1, tor3 under spine2.
    "three_level": ({"tor1": 3, "tor2": 3, "tor3": 3, "spine1": 3, "spine2": 2, "core": 3},
                    [(("tor1", 3), ("spine1", 1)), (("tor2", 3), ("spine1", 2)),
                     (("tor3", 3), ("spine2", 1)), (("spine1", 3), ("core", 1)),
                     (("spine2", 2), ("core", 2))]),
    # Both ToRs linked to both spines (a loop for ordinary traffic): ports 3 and 4 go up.
    "two_spines": ({"tor1": 4, "tor2": 4, "spine1": 3, "spine2": 3},
                   [(("tor1", 3), ("spine1", 1)), (("tor2", 3), ("spine1", 2)),
                    (("tor1", 4), ("spine2", 1)), (("tor2", 4), ("spine2", 2))]),
}


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
    p4build.build()


@pytest.fixture(params=TARGETS)
def target(request) -> str:
    reason = skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    if request.param == "bmv2":
        request.getfixturevalue("built_pipeline")
    return request.param


# Switch processes are started once per target and layout; each test gets them reset (pipeline
# pushed again: tables, counters, registers empty), which is what a fresh start gives, faster.
_fabrics: dict[tuple[str, str], Fabric] = {}


@pytest.fixture(scope="session")
def _fabric_cache(tmp_path_factory):
    yield _fabrics
    for fabric in _fabrics.values():
        fabric.close()
    _fabrics.clear()


def reset_fabric(layout: str, target: str, tmp_path_factory) -> Fabric:
    """The cached fabric of that layout on that target (started on first use), reset; the
    caller holds `_fabric_cache`, which closes them at the end of the session."""
    key = (layout, target)
    if key not in _fabrics:
        switches, links = LAYOUTS[layout]
        logs = tmp_path_factory.mktemp("switch-logs") \
            if os.environ.get("PASSING_SWITCH_LOGS") else None
        _fabrics[key] = Fabric(target, switches, links, log_dir=logs)
    fabric = _fabrics[key]
    fabric.reset()
    return fabric


@pytest.fixture
def fabric_of(target, _fabric_cache, tmp_path_factory):
    """fabric_of(layout) -> a reset Fabric of that layout on the current target."""
    return lambda layout: reset_fabric(layout, target, tmp_path_factory)
