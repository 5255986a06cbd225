"""Mininet switch nodes running the PASSING pipeline: BMv2 (`simple_switch_grpc --no-p4`, the
pipeline pushed by the controller over P4Runtime) or the software model. Each gets its own gRPC
port on 127.0.0.1; logs (and BMv2 pcaps, when asked) go under the run directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from mininet.link import TCIntf, TCLink
from mininet.node import Switch

from passing.tcp_probe import accepts
from topologies.link_rate import htb_class_options

# Switch n listens for P4Runtime on GRPC_PORT_BASE + n and for Thrift (BMv2) or register
# inspection (model) SIDE_PORT_OFFSET above that. Both ranges lie below Linux's ephemeral ports
# (32768-60999): a fixed port inside them can be held, at the moment a switch starts, by any
# process's outgoing connection whose source port the kernel drew there, and the switch then
# cannot bind it (CI once lost spine2's 50006 that way).
GRPC_PORT_BASE = 10001
SIDE_PORT_OFFSET = 10000
MAX_SWITCH_INDEX = SIDE_PORT_OFFSET - 2  # the highest P4Runtime port stays below the side ports
EGRESS_QUEUE_DEPTH = 1024  # packets per BMv2 egress port (BMv2Switch.deepen_egress_queues)
# What makes libpcap size its ring's slots for 64 KiB frames (PassingSwitch._no_offload), as
# `ethtool -k` names them.
_OFFLOADS = ("tcp-segmentation-offload", "generic-segmentation-offload",
             "generic-receive-offload", "large-receive-offload", "udp-fragmentation-offload")


class QuietTCIntf(TCIntf):
    """Mininet's shaped interface, its htb class with the quantum set (link_rate.HTB_QUANTUM):
    otherwise tc warns at every rate above 20 Mbit/s and Mininet prints each warning as an
    error."""

    def bwCmds(self, bw=None, **kwargs):  # noqa: N802 - Mininet's name
        cmds, parent = super().bwCmds(bw=bw, **kwargs)
        if not bw or kwargs.get("use_hfsc") or kwargs.get("use_tbf"):
            return cmds, parent
        plain = f"htb rate {bw:f}Mbit burst 15k"
        if not any(c.endswith(plain) for c in cmds):
            raise RuntimeError(f"Mininet's htb class is not {plain!r}: {cmds}")
        return [c[:-len(plain)] + "htb " + htb_class_options(bw) if c.endswith(plain) else c
                for c in cmds], parent


class QuietTCLink(TCLink):
    """TCLink with QuietTCIntf at both ends."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("cls1", QuietTCIntf)
        kwargs.setdefault("cls2", QuietTCIntf)
        super().__init__(*args, **kwargs)


def bmv2_available() -> bool:
    return all(shutil.which(b) for b in ("simple_switch_grpc", "p4c-bm2-ss"))


def pick_target(target: str) -> tuple[str, str]:
    """('bmv2'|'model', why)."""
    if target == "auto":
        if bmv2_available():
            return "bmv2", "auto: simple_switch_grpc and p4c-bm2-ss found"
        return "model", "auto: BMv2/p4c not installed, using the software model"
    if target == "bmv2" and not bmv2_available():
        raise SystemExit("TARGET=bmv2 but simple_switch_grpc or p4c-bm2-ss is not on PATH")
    if target not in ("bmv2", "model"):
        raise SystemExit(f"unknown target {target!r}: use auto, bmv2 or model")
    return target, f"{target}: as asked"


class PassingSwitch(Switch):
    """Base: a switch process attached to the node's Mininet interfaces by port number."""

    def __init__(self, name: str, device_id: int, grpc_port: int, run_dir: Path,
                 pcap: bool = False, log: bool = False, **kw):
        kw.setdefault("dpid", f"{device_id + 1:016x}")  # names like "spine" have no digits
        super().__init__(name, **kw)
        self.device_id = device_id
        self.grpc_port = grpc_port
        self.run_dir = Path(run_dir)
        self.pcap = pcap
        self.log = log
        self.proc = None

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def side_port(self) -> int:
        """BMv2's Thrift port, or the model's register inspection port."""
        return self.grpc_port + SIDE_PORT_OFFSET

    def port_args(self) -> list[str]:
        args = []
        for intf in self.intfList():
            if intf.name != "lo":
                args += ["-i", f"{self.ports[intf]}@{intf.name}"]
        return args

    def command(self) -> list[str]:
        raise NotImplementedError

    def _no_offload(self, port: str) -> None:
        """Before the switch opens `port`: with any segmentation or receive offload on (a
        veth has TSO and GSO on), libpcap sizes each slot of its capture ring for a 64 KiB
        frame, not the MTU, so BMv2's 2 MB ring holds only 16-32 frames (by libpcap's rounding)
        and drops a window's burst: 10% of a 64-slot window's packets were resent. No frame
        here exceeds the MTU (the hosts segment in software: their checksum offload is off,
        PassingNetwork), so nothing needs the larger slots."""
        self.cmd(f"ethtool -K {port} tso off gso off gro off lro off")
        features = self.cmd(f"ethtool -k {port}")
        still_on = [f for f in _OFFLOADS if f"{f}: on" in features]
        if still_on:
            print(f"*** {self.name}: {port} keeps {', '.join(still_on)} on; a BMv2 switch may "
                  "drop bursts on this port (see PassingSwitch._no_offload)", file=sys.stderr)

    def start(self, controllers) -> None:
        for intf in self.intfList():
            if intf.name != "lo":
                self.cmd(f"sysctl -qw net.ipv6.conf.{intf.name}.disable_ipv6=1")
                self._no_offload(intf.name)
        # gRPC binds with SO_REUSEPORT: a switch left running by an earlier run would share the
        # port with this one, and the controller could program either.
        for port in (self.grpc_port, self.side_port):
            if accepts("127.0.0.1", port, timeout=1.0):
                raise RuntimeError(f"switch {self.name}: something already listens on "
                                   f"127.0.0.1:{port} (a fabric left running? `make stop`)")
        log_path = self.run_dir / f"{self.name}.log"
        with open(log_path, "w") as log:
            self.proc = self.popen(self.command(), stdout=log, stderr=log)
        # `make stop` kills exactly the processes recorded here.
        (self.run_dir / f"{self.name}.pid").write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise RuntimeError(f"switch {self.name} exited: {' '.join(tail)} "
                                   f"(whole log: {log_path})")
            if accepts("127.0.0.1", self.grpc_port, timeout=1.0):
                return
            time.sleep(0.1)
        raise RuntimeError(f"switch {self.name}: no gRPC server on {self.grpc_address}")

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 (Mininet's name)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except Exception:
                self.proc.kill()
        (self.run_dir / f"{self.name}.pid").unlink(missing_ok=True)
        super().stop(deleteIntfs)


class BMv2Switch(PassingSwitch):
    def deepen_egress_queues(self) -> None:
        """simple_switch keeps 64 packets per egress port unless told: a burst that finds the
        port's egress thread descheduled for a few ms (three BMv2 processes and the agents
        sharing two cores) overflows it silently (no counter sees it) and a window is resent:
        up to 2% of a 64-slot window's packets, in one run of four. A switch port's buffer is
        far deeper than 64 frames. The depth outlives pipeline pushes (simple_switch keeps its
        queues across a config swap), but the CLI needs the pipeline loaded to connect."""
        res = subprocess.run(
            ["simple_switch_CLI", "--thrift-port", str(self.side_port)],
            input=f"set_queue_depth {EGRESS_QUEUE_DEPTH}\n", capture_output=True, text=True,
            timeout=60)
        if res.returncode != 0 or "Error" in res.stdout or "Traceback" in res.stderr:
            raise RuntimeError(f"switch {self.name}: set_queue_depth {EGRESS_QUEUE_DEPTH} "
                               f"failed: {res.stdout[-500:]} {res.stderr[-500:]}")

    def command(self) -> list[str]:
        cmd = ["simple_switch_grpc", "--device-id", str(self.device_id), "--no-p4",
               "--thrift-port", str(self.side_port), *self.port_args()]
        if self.log:  # a log line per table and action of every packet: slow, for debugging
            cmd += ["--log-file", str(self.run_dir / f"{self.name}-bmv2"), "--log-flush"]
        else:
            # BMv2's default level is trace, and it formats every line (a packet's tables,
            # actions and register values) even with no log to write it to, where nobody
            # sees it: two thirds of its CPU. Off, it carries about 3x the packets
            # (docs/benchmarks.md, "BMv2 at the shipped link rate").
            cmd += ["--log-level", "off"]
        if self.pcap:
            cmd += ["--pcap", str(self.run_dir)]
        return [*cmd, "--", "--grpc-server-addr", self.grpc_address]


class ModelSwitch(PassingSwitch):
    def command(self) -> list[str]:
        return [sys.executable, "-m", "switch_model", "--device-id", str(self.device_id),
                *self.port_args(), "--grpc-server-addr", self.grpc_address,
                "--inspect-addr", f"127.0.0.1:{self.side_port}",
                "--log-level", "INFO" if self.log else "WARNING"]
