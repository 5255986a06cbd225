"""Each Mininet switch's own TCP ports (P4Runtime, and BMv2's Thrift or the model's register
inspection): below the kernel's ephemeral range, where any process's outgoing connection may hold
a port at the moment a switch needs it (CI once lost a spine's port that way); distinct across a
large generated fabric; a fabric too large for the plan, or a port something already listens on,
refused before any switch starts, with an error that names it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controller.topology import load
from tests import REPO
from tests.conftest import skip_reason
from topologies import fabric
from topologies import mininet_fabric as mf_module
from topologies.mininet_fabric import MininetFabric
from topologies.mininet_nodes import SIDE_PORT_OFFSET
from topologies.network import PassingNetwork


def first_ephemeral_port() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def switch_ports(mfab: MininetFabric) -> list[int]:
    grpc = [int(addr.rsplit(":", 1)[1]) for addr, _ in mfab.switch_addresses().values()]
    return grpc + [p + SIDE_PORT_OFFSET for p in grpc]


def test_a_large_fabrics_switch_ports_are_distinct_and_below_the_ephemeral_range(tmp_path):
    path = tmp_path / "fabric.json"
    assert fabric.main(["--racks", "64", "--hosts-per-rack", "2", "--gpus", "1",
                        "--spines", "8", "-o", str(path)]) == 0
    mfab = MininetFabric(load(path), "model", tmp_path / "run")
    ports = switch_ports(mfab)
    assert len(ports) == 2 * 72
    assert len(set(ports)) == len(ports)
    assert min(ports) > 1024 and max(ports) < first_ephemeral_port(), (min(ports), max(ports))


def test_a_fabric_beyond_the_port_plan_is_refused_before_mininet_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(mf_module, "MAX_SWITCH_INDEX", 1)
    path = REPO / "topologies" / "leafspine.json"
    mfab = MininetFabric(load(path), "model", tmp_path / "run")
    with pytest.raises(ValueError, match=r"index above 1: .*python -m sim"):
        mfab.start()
    assert mfab.net is None and not (tmp_path / "run").exists()


def test_a_switch_port_already_listened_on_is_refused_and_nothing_is_left_running(tmp_path):
    reason = skip_reason("model")
    if reason:
        pytest.skip(reason)
    path = REPO / "topologies" / "leafspine.json"
    pnet = PassingNetwork(load(path), path, "model", tmp_path / "run")
    grpc = {name: int(addr.rsplit(":", 1)[1])
            for name, (addr, _) in pnet.fabric.switch_addresses().items()}
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", grpc["spine"]))
        squatter.listen()
        with pytest.raises(RuntimeError, match=f"already listens on 127.0.0.1:{grpc['spine']}"):
            pnet.start()
        # The switches started before the refusal were stopped again: their ports are free,
        # their pid files gone; the squatter still holds its port.
        for name, port in grpc.items():
            if name != "spine":
                probe = socket.socket()
                try:
                    assert probe.connect_ex(("127.0.0.1", port)) != 0, name
                finally:
                    probe.close()
        assert not list((tmp_path / "run").glob("*.pid"))
        assert squatter.getsockname()[1] == grpc["spine"]
    finally:
        squatter.close()
        pnet.stop()
