"""Fixtures of the controller tests.

Tests that send frames run against a fabric of switch processes on veth pairs (`fabric_of`,
root). Tests that only program and read switches run against `switches_of`: on the model, its
P4Runtime service served in this process on 127.0.0.1, with no data-plane ports, so they need
no root (as p4runtime-shell tests its client against an in-process server); on BMv2, the
fabric's switch processes as before, since BMv2's P4Runtime server is the other one the
controller must work with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

from controller.core import Controller, Endpoint
from controller.switch import SwitchConnection
from controller.topology import load
from passing.pipeline_files import load_p4info, pipeline_files
from switch_model.p4runtime_server import P4RuntimeService, listen
from switch_model.pipeline import Pipeline
from testbed.fabric import FABRIC_ELECTION_ID
from tests import REPO
from tests.conftest import LAYOUTS, reset_fabric, skip_reason

LAYOUT_OF = {"star": "star", "leafspine": "two_level"}


@dataclass
class ServedSwitch:
    name: str
    device_id: int
    service: P4RuntimeService
    server: grpc.Server
    port: int
    conn: SwitchConnection | None = None

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.port}"


class ServedSwitches:
    """The model's P4Runtime service for each switch of a layout (device ids in layout order,
    as the fabric numbers them), each on its own free port, started empty (no pipeline, as the
    fabric starts its switch processes) and programmed as the fabric programs them: a backup
    connection below the controller's election id pushes the pipeline, and stays for reads."""

    def __init__(self, names: list[str]):
        info = load_p4info()
        self.switches: dict[str, ServedSwitch] = {}
        try:
            for device_id, name in enumerate(names):
                service = P4RuntimeService(Pipeline.from_p4info(info), device_id, info,
                                           preloaded=False)
                server, port = listen(service, "127.0.0.1:0")
                sw = ServedSwitch(name, device_id, service, server, port)
                self.switches[name] = sw
                sw.conn = SwitchConnection(name, sw.grpc_address, device_id,
                                           election_id=FABRIC_ELECTION_ID)
                sw.conn.set_pipeline(*pipeline_files())
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> ServedSwitch:
        return self.switches[name]

    def close(self) -> None:
        for sw in self.switches.values():
            if sw.conn is not None:
                sw.conn.close()
            sw.server.stop(grace=None)


@pytest.fixture(params=["model", "bmv2"])
def switches_of(request, _fabric_cache, tmp_path_factory):
    """switches_of(layout) -> the switches of that layout, empty but for the pipeline, for
    tests that send no frames: the model served in-process, or BMv2's switch processes."""
    if request.param == "model":
        served: list[ServedSwitches] = []

        def get(layout: str) -> ServedSwitches:
            served.append(ServedSwitches(list(LAYOUTS[layout][0])))
            return served[-1]
        yield get
        for s in served:
            s.close()
        return
    reason = skip_reason("bmv2")
    if reason:
        pytest.skip(reason)
    request.getfixturevalue("built_pipeline")
    yield lambda layout: reset_fabric(layout, "bmv2", tmp_path_factory)


def _controllers(switches_of: Callable, tmp_path):
    made = []

    def make(topo_name: str, state=None, fabric=None, **kw) -> tuple[Controller, object]:
        topo = load(REPO / "topologies" / f"{topo_name}.json")
        fabric = fabric or switches_of(LAYOUT_OF[topo_name])
        endpoints = {n: Endpoint(n, fabric[n].grpc_address, fabric[n].device_id)
                     for n in topo.switches}
        ctl = Controller(topo, endpoints, state or tmp_path / "state.sqlite", **kw)
        made.append(ctl)
        return ctl, fabric
    return make, made


@pytest.fixture
def make_controller(fabric_of, tmp_path):
    """make(topology, state=None, fabric=None, **kw) -> (Controller, Fabric): a controller of
    topologies/<topology>.json driving that layout's fabric (reset), closed after the test."""
    make, made = _controllers(fabric_of, tmp_path)
    yield make
    for ctl in made:
        ctl.close()


@pytest.fixture
def make_control(switches_of, tmp_path):
    """make_controller's twin on `switches_of`: for tests that send no frames."""
    make, made = _controllers(switches_of, tmp_path)
    yield make
    for ctl in made:
        ctl.close()
