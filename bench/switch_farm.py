"""Software-model switch processes with no ports, each serving P4Runtime on 127.0.0.1: what a
controller benchmark talks to when no packet needs to flow (bench.controller_scale). Started
without a pipeline (`--no-p4`, as BMv2 starts under Mininet); stopped by the PIDs started here."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from passing.tcp_probe import accepts


class SwitchFarm:
    def __init__(self, ports: dict[str, int], log_dir: Path, start_timeout: float = 300.0):
        self.ports = ports
        self.log_dir = log_dir
        self.start_timeout = start_timeout
        self.procs: dict[str, subprocess.Popen] = {}
        self.started_in = 0.0

    def __enter__(self) -> SwitchFarm:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            for i, (name, port) in enumerate(self.ports.items()):
                log = open(self.log_dir / f"{name}.log", "w")
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "switch_model", "--device-id", str(i), "--no-p4",
                     "--grpc-server-addr", f"127.0.0.1:{port}", "--log-level", "WARNING"],
                    stdout=log, stderr=subprocess.STDOUT)
                log.close()
            self._wait()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.perf_counter() - t0

    def _wait(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = dict(self.ports)
        while waiting:
            for name, port in list(waiting.items()):
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"switch {name} exited; see {self.log_dir / name}.log")
                if accepts("127.0.0.1", port, timeout=1.0):
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"no gRPC server after {self.start_timeout} s: "
                                   f"{', '.join(waiting)}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs.values())

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
