"""Fixtures of the controller tests that run against live switches."""

from __future__ import annotations

import pytest

from controller.core import Controller, Endpoint
from controller.topology import load
from passing.pipeline_files import REPO

LAYOUT_OF = {"star": "star", "leafspine": "two_level"}


@pytest.fixture
def make_controller(fabric_of, tmp_path):
    """make(topology, state=None, fabric=None, **kw) -> (Controller, Fabric): a controller of
    topologies/<topology>.json driving that layout's fabric (reset), closed after the test."""
    made = []

    def make(topo_name: str, state=None, fabric=None, **kw) -> tuple[Controller, object]:
        topo = load(REPO / "topologies" / f"{topo_name}.json")
        fabric = fabric or fabric_of(LAYOUT_OF[topo_name])
        endpoints = {n: Endpoint(n, fabric[n].grpc_address, fabric[n].device_id)
                     for n in topo.switches}
        ctl = Controller(topo, endpoints, state or tmp_path / "state.sqlite", **kw)
        made.append(ctl)
        return ctl, fabric
    yield make
    for ctl in made:
        ctl.close()
