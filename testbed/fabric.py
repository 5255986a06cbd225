"""A small fabric of switches on veth pairs for data-plane tests.

Each switch port is either linked to another switch's port (a veth pair between them) or exposed
to the test (a veth pair whose far end the test reads and writes with raw AF_PACKET sockets).
The switch processes are started here, programmed over real P4Runtime, and everything created is
removed in `close()` (also when a test fails).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from controller.switch import SwitchConnection, SwitchError, Update
from passing.pipeline_files import pipeline_files
from testbed.veth_ports import TestPort, delete_link, free_tcp_port, make_veth

FABRIC_ELECTION_ID = (0, 5)
START_ATTEMPTS = 3


@dataclass
class SwitchHandle:
    name: str
    device_id: int
    grpc_port: int
    thrift_port: int
    interfaces: dict[int, str]
    proc: subprocess.Popen | None = None
    conn: SwitchConnection | None = None
    test_ports: dict[int, TestPort] = field(default_factory=dict)

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


class Fabric:
    """switches: name -> number of ports (numbered 1..n); links: ((sw, port), (sw, port))."""

    _seq = 0

    def __init__(self, target: str, switches: dict[str, int],
                 links: Iterable[tuple[tuple[str, int], tuple[str, int]]] = (),
                 log_dir: Path | None = None):
        self.target = target
        self.log_dir = log_dir
        self._links: list[str] = []
        self.switches: dict[str, SwitchHandle] = {}
        # Interface names must be unique across fabrics alive at once, and at most 15 bytes.
        # A tag some interface already carries (a crashed run's veths, or another process's
        # whose pid ends alike) is skipped, never taken over.
        taken = [n[2:] for n in os.listdir("/sys/class/net") if n[:2] in ("pl", "ps", "pt")]
        for _ in range(36):
            Fabric._seq += 1
            tag = f"{os.getpid() % 1000:03d}{Fabric._seq % 36:x}"
            if not any(n.startswith(tag) for n in taken):
                break
        else:
            raise RuntimeError(f"every test interface tag of this process is in use ({len(taken)} "
                               "pl/ps/pt interfaces): remove those crashed runs left")
        try:
            linked = {}
            for i, ((sa, pa), (sb, pb)) in enumerate(links):
                a, b = f"pl{tag}{i}a", f"pl{tag}{i}b"
                make_veth(a, b)
                self._links.append(a)
                linked[(sa, pa)], linked[(sb, pb)] = a, b
            for d, (name, nports) in enumerate(switches.items()):
                interfaces, exposed = {}, {}
                for port in range(1, nports + 1):
                    if (name, port) in linked:
                        interfaces[port] = linked[(name, port)]
                        continue
                    s, t = f"ps{tag}{d}p{port}", f"pt{tag}{d}p{port}"
                    make_veth(s, t)
                    self._links.append(s)
                    interfaces[port], exposed[port] = s, t
                sw = SwitchHandle(name, d, free_tcp_port(), free_tcp_port(), interfaces)
                self.switches[name] = sw
                sw.proc = self._start(sw)
                sw.test_ports = {p: TestPort(ifn) for p, ifn in exposed.items()}
            for sw in self.switches.values():
                self._connect(sw, keep_ports=False)
        except BaseException:
            self.close()
            raise

    def _connect(self, sw: SwitchHandle, keep_ports: bool) -> None:
        """Connect to a started switch and push the pipeline. A switch whose P4Runtime server
        does not come up (its process died, or a port was taken) is started again, on fresh
        ports unless `keep_ports`, up to START_ATTEMPTS times; the error then says why."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                # Below the controller's default (0, 10): a controller under test becomes
                # primary, this connection a backup that still reads, and primary again when
                # the controller leaves.
                sw.conn = SwitchConnection(sw.name, sw.grpc_address, sw.device_id,
                                           election_id=FABRIC_ELECTION_ID, connect_timeout=30)
                sw.conn.set_pipeline(*pipeline_files())
                return
            except SwitchError as e:
                status = sw.proc.poll()
                state = "alive" if status is None else f"exited with {status}"
                why = f"{e}; process {state}"
                if attempt == START_ATTEMPTS:
                    raise SwitchError(f"{why} after {attempt} starts; log: {self._log_tail(sw)}") \
                        from None
                print(f"fabric: {why}; starting {sw.name} again", file=sys.stderr)
                self._stop(sw)
                if not keep_ports:
                    sw.grpc_port, sw.thrift_port = free_tcp_port(), free_tcp_port()
                sw.proc = self._start(sw)

    def _log_tail(self, sw: SwitchHandle) -> str:
        if self.log_dir is None:
            return "(no log directory; set PASSING_SWITCH_LOGS=1)"
        try:
            return (self.log_dir / f"{sw.name}.out").read_text(errors="replace")[-2000:]
        except OSError as e:
            return f"(unreadable: {e})"

    @staticmethod
    def _stop(sw: SwitchHandle) -> None:
        if sw.conn is not None:
            try:
                sw.conn.close()
            except Exception:
                pass
            sw.conn = None
        if sw.proc is not None and sw.proc.poll() is None:
            sw.proc.terminate()
            try:
                sw.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sw.proc.kill()
                sw.proc.wait()

    def _start(self, sw: SwitchHandle) -> subprocess.Popen:
        ifaces = [a for port, ifname in sw.interfaces.items() for a in ("-i", f"{port}@{ifname}")]
        if self.target == "bmv2":
            cmd = [shutil.which("simple_switch_grpc") or "simple_switch_grpc",
                   "--device-id", str(sw.device_id), "--thrift-port", str(sw.thrift_port),
                   "--no-p4", *ifaces]
            if self.log_dir is not None:
                # The console (into <name>.out below), not --log-file: that one rotates at
                # 5 MB and drops trace lines, which register_writes counts.
                cmd += ["--log-console", "--log-level", "trace"]
            else:  # trace by default, formatted with no log to go to: 3x slower
                cmd += ["--log-level", "off"]
            cmd += ["--", "--grpc-server-addr", sw.grpc_address]
        elif self.target == "model":
            # The model's register inspection service takes the place of BMv2's Thrift port.
            cmd = [sys.executable, "-m", "switch_model", "--device-id", str(sw.device_id),
                   "--no-p4", *ifaces, "--grpc-server-addr", sw.grpc_address,
                   "--inspect-addr", f"127.0.0.1:{sw.thrift_port}"]
            if self.log_dir is not None:
                cmd += ["--log-level", "INFO"]
        else:
            raise ValueError(f"unknown target {self.target!r}")
        out = open(self.log_dir / f"{sw.name}.out", "w") if self.log_dir else subprocess.DEVNULL
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def reset(self) -> None:
        """Back to a freshly started fabric: pushing the pipeline again empties every table,
        counter and register, on BMv2 and on the model alike; frames still queued are dropped.
        BMv2's P4Runtime server forgets its multicast groups on a push but leaves them in the
        switch's replication engine, so they are deleted explicitly first."""
        for sw in self.switches.values():
            if sw.proc is not None and sw.proc.poll() is not None:
                raise RuntimeError(f"switch {sw.name} exited with status {sw.proc.returncode}")
            if sw.conn.info is not None:
                sw.conn.write([sw.conn.multicast_update(Update.DELETE, g)
                               for g in sw.conn.read_multicast_groups()])
            sw.conn.set_pipeline(*pipeline_files())
            for tp in sw.test_ports.values():
                tp.drain()

    def __getitem__(self, name: str) -> SwitchHandle:
        return self.switches[name]

    @property
    def registers_readable(self) -> bool:
        """BMv2's Thrift register_read returns 64-bit values, and the pipeline's registers are
        240 and 2048 bits wide: on BMv2 the tests check register contents through behaviour
        (a slot completes with exactly the expected sum and count), on the model directly.
        Either way a cell is one register word: slot_values holds protocol.VALUE_WORDS of them
        per slot and version, at (2*slot+version)*VALUE_WORDS + w."""
        return self.target == "model"

    def register_read(self, switch: str, register: str, index: int) -> int:
        if not self.registers_readable:
            raise RuntimeError(f"{self.target}: registers wider than 64 bits are not readable")
        sw = self.switches[switch]
        request = f"register_read {register} {index}\n"
        if self.target == "bmv2":
            res = subprocess.run(["simple_switch_CLI", "--thrift-port", str(sw.thrift_port)],
                                 input=request, text=True, capture_output=True, check=True)
            output = res.stdout
        else:
            with socket.create_connection(("127.0.0.1", sw.thrift_port), timeout=5) as s:
                s.sendall(request.encode())
                output = s.makefile().readline()
        for line in output.splitlines():
            if f"{register}[{index}]" in line:
                return int(line.split("=", 1)[1].strip(), 0)
        raise RuntimeError(f"register_read {register} {index}: unexpected output {output!r}")

    @property
    def registers_whole(self) -> bool:
        """Whether register_cells returns whole cells: the model's do; BMv2's Thrift API
        returns at most 64 bits of a cell, so there register_writes is the whole-state check
        (BMv2 registers change only through the pipeline's register_write, which its trace log
        records with the full value)."""
        return self.target == "model"

    def register_cells(self, switch: str, register: str) -> list[int]:
        """Every cell of a register, read at one instant: whole on the model, what BMv2's
        Thrift register_read gives (at most 64 bits each) on BMv2."""
        sw = self.switches[switch]
        if self.target == "bmv2":
            res = subprocess.run(["simple_switch_CLI", "--thrift-port", str(sw.thrift_port)],
                                 input=f"register_read {register}\n", text=True,
                                 capture_output=True, check=True)
            # The answer follows the CLI's prompt: "RuntimeCmd: NAME= v0, v1, ..."
            line = next((x for x in res.stdout.splitlines() if f"{register}= " in x), "")
            cells = line.partition(f"{register}= ")[2].replace(",", " ").split()
        else:
            with socket.create_connection(("127.0.0.1", sw.thrift_port), timeout=30) as s:
                s.sendall(f"register_dump {register}\n".encode())
                line = s.makefile().readline()
            cells = line.partition("=")[2].split() if line.startswith(f"{register}=") else []
        if not cells:
            raise RuntimeError(f"{switch}: cannot read register {register}")
        return [int(c) for c in cells]

    def register_writes(self, switch: str) -> int:
        """BMv2 with a log_dir: register writes the switch's trace log has recorded so far."""
        if self.target != "bmv2" or self.log_dir is None:
            raise RuntimeError("register writes are logged by BMv2 with a log directory only")
        with open(self.log_dir / f"{switch}.out", errors="replace") as f:
            return sum("Wrote register" in line for line in f)

    def restart(self, switch: str) -> None:
        """Kill one switch process and start it again on the same ports, empty (no pipeline,
        registers zero), as a crash and restart would leave it; the test's connection is
        re-established and the pipeline pushed, but no table entry is installed."""
        sw = self.switches[switch]
        sw.conn.close()
        sw.conn = None
        sw.proc.kill()
        sw.proc.wait()
        sw.proc = self._start(sw)
        self._connect(sw, keep_ports=True)

    def close(self) -> None:
        for sw in self.switches.values():
            for tp in sw.test_ports.values():
                tp.close()
            self._stop(sw)
        for ifname in self._links:
            delete_link(ifname)
        self._links.clear()
