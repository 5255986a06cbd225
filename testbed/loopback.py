"""The software switch's pipeline driven in-process: host agents exchange UDP payloads with it
through queues, with optional random loss on every link in both directions. No sockets, no
root: for testing the agents' window and loss recovery against the real pipeline logic. The job
is installed by the controller's installer through the model's P4Runtime service, in-process."""

from __future__ import annotations

import queue
import random
import secrets
import socket
import threading
from collections.abc import Iterable

import numpy as np
from google.rpc import code_pb2

from controller import installer
from controller.switch import SwitchWriter, Update, WriteError
from passing.contract import HostParams, JobParams
from passing.p4info import P4InfoIndex
from passing.pipeline_files import load_p4info
from switch_model.p4runtime_server import P4RuntimeService
from switch_model.pipeline import PASSING_OFF, Pipeline
from testbed.entries import agent_port, job_entries, switch_mac, to_switch

DEV = 0


class InProcessConnection(SwitchWriter):
    """Writes P4Runtime updates to a switch model's P4Runtime service in this process, without
    gRPC: the service applies them as it applies a Write, so the controller's installer and
    its messages program an in-process model exactly as they program a switch over the
    network."""

    def __init__(self, service: P4RuntimeService, name: str = "loopback"):
        super().__init__(name, P4InfoIndex(service.own_p4info))
        self.service = service

    def write(self, updates: Iterable[Update]) -> None:
        ups = list(updates)
        failures = [(i, code_pb2.Code.Name(err[0]), err[1])
                    for i, err in enumerate(self.service.apply_updates(ups)) if err is not None]
        if failures:
            raise WriteError.of(self.name, ups, failures)


class LoopbackSwitch:
    """One switch (root) with hosts on ports 1..n, one job over all of them. With ranks > 1
    the job is switch-only INA: `ranks` contributors behind each port (ids (p-1)*ranks + r),
    rank r answered on the agents' UDP port + r."""

    def __init__(self, hosts: int, job_id: int = 1, slots: int = 16, loss: float = 0.0,
                 seed: int = 0, ranks: int = 1, agent_udp_port: int | None = None,
                 quorum: int = 0):
        info = load_p4info()
        self.pipe = Pipeline.from_p4info(info)
        self.service = P4RuntimeService(self.pipe, DEV, info)
        self.job_id, self.slots, self.loss = job_id, slots, loss
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.queues = {p: queue.Queue() for p in range(1, hosts + 1)}
        self.delivered = self.dropped = 0
        self.ranks = ranks
        self._heads: dict[tuple[int, int], bytes] = {}
        self.entries = job_entries(
            DEV, job_id, {p: ((p - 1) * ranks, ranks) for p in self.queues}, pool_size=slots,
            mcast_grp=9, guard=False, quorum=quorum,
            agent_port_of=(lambda p, r: agent_udp_port + r) if agent_udp_port else agent_port)
        installer.install(InProcessConnection(self.service), self.entries)

    def _lost(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss

    def transport(self, port: int) -> LoopbackTransport:
        return LoopbackTransport(self, port)

    def frame_of(self, port: int, payload: bytes) -> bytes:
        """The frame the host on `port` sends for `payload` (to_switch, without a UDP
        checksum). Its headers depend only on the port and the payload's length, so they are
        built once (scapy takes ~2 ms a frame, far more than the pipeline)."""
        key = (port, len(payload))
        head = self._heads.get(key)
        if head is None:
            head = self._heads[key] = to_switch(DEV, port, bytes(len(payload)),
                                                udp_chksum=0)[:PASSING_OFF]
        return head + payload

    def deliver(self, port: int, payload: bytes) -> None:
        frame = self.frame_of(port, payload)
        with self.lock:
            if self._lost():
                self.dropped += 1
                return
            outs = self.pipe.process(port, frame)
            for egress, out in outs:
                if self._lost():
                    self.dropped += 1
                    continue
                self.delivered += 1
                self.emit(egress, out[PASSING_OFF:], int.from_bytes(out[36:38], "big"))

    def emit(self, port: int, payload: bytes, udp_port: int) -> None:
        # In memory a port has one queue: one rank per port (INA ranks need UdpLoopbackSwitch).
        self.queues[port].put(payload)


class LoopbackTransport:
    def __init__(self, switch: LoopbackSwitch, port: int):
        self.switch, self.port = switch, port

    def send(self, payload: bytes) -> None:
        self.switch.deliver(self.port, payload)

    def recv(self, timeout: float) -> list[bytes]:
        q = self.switch.queues[self.port]
        try:
            out = [q.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(q.get_nowait())
            except queue.Empty:
                return out


def random_tensors(hosts: int, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(hosts)]


class UdpLoopbackSwitch(LoopbackSwitch):
    """The same switch behind a UDP socket on 127.0.0.1: agents in other processes reach it with
    their real UDP transport, each host from its own loopback address 127.0.0.(10+port)."""

    def __init__(self, hosts: int, agent_udp_port: int, **kw):
        super().__init__(hosts, agent_udp_port=agent_udp_port, **kw)
        self.agent_udp_port = agent_udp_port
        # Keyed like the controller's jobs, so that the agents' keyed rendezvous is what runs.
        self.session_key = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @staticmethod
    def host_address(port: int) -> str:
        return f"127.0.0.{10 + port}"

    def agent_params(self, local_gpus: int = 1) -> JobParams:
        """The job parameters a controller would hand to the agents (passing.contract).
        A switch built with ranks > 1 is an `ina` job with that many ranks per host."""
        ina = self.ranks > 1
        gpus = self.ranks if ina else local_gpus
        hosts = tuple(HostParams(f"h{p}", host_ip=self.host_address(p), switch_ip="127.0.0.1",
                                 switch_mac=switch_mac(DEV), contributor_id=(p - 1) * self.ranks,
                                 local_gpus=gpus) for p in self.queues)
        return JobParams(self.job_id, "ina" if ina else "passing", session_key=self.session_key,
                         switch_udp_port=self.address[1], agent_udp_port=self.agent_udp_port,
                         window=self.slots, hosts=hosts)

    def _serve(self) -> None:
        by_ip = {self.host_address(p): p for p in self.queues}
        while not self._stop.is_set():
            try:
                payload, (ip, _) = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            if ip in by_ip:
                self.deliver(by_ip[ip], payload)

    def emit(self, port: int, payload: bytes, udp_port: int) -> None:
        self.sock.sendto(payload, (self.host_address(port), udp_port))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
