"""What each piece of a fabric costs besides the links: switches, agents, the in-host stage, the
TCP strategies' per-message overhead, and (for the 2-core emulation) the one shared CPU.

Two regimes:

* `emulation(calibration)`: the Mininet fabric `make bench` measures on this 2-core machine.
  Every host's processes, every switch process and the kernel's per-frame work (veth, htb,
  sockets) share two cores, so all CPU work runs on one 2-core SimGrid host, "the machine",
  alongside the links. The switches' and the agent's packet rates come from the benchmark's
  calibration line (each component measured alone before the sweep); the other constants are
  in FITTED, with where each comes from.
* `datacenter(in_host)`: servers with their own CPUs and GPUs, switch ASICs that aggregate at
  line rate, agents that keep up with their NIC (a DPDK/RDMA-class agent, as SwitchML's: the
  Python agent here would not), and an in-host stage over NVLink (NVSwitch) or PCIe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# SimGrid's LV08 network model (its default): one flow alone gets 97% of a link's bandwidth, and
# every flow also loads its reverse path with 5% of its rate (TCP's ACKs), so flows in both
# directions of a full-duplex link each get 0.97 / 1.05 = 92.4% (docs/simulation.md).
SIMGRID_BANDWIDTH_FACTOR = 0.97
SIMGRID_CROSSTRAFFIC = 0.05


@dataclass(frozen=True)
class Calibration:
    """The calibration line of a `make bench` report: packets/s of each component alone."""

    switch_agg_pps: float
    switch_fwd_pps: float
    agent_pps: float
    cores: int = 2
    # The unit of the kernel's per-frame work (frame_cpu_fwd): the model switch's forwarding
    # rate, whichever target runs, since the kernel's veths and htb do not depend on the
    # switch. None: this calibration's own switch_fwd_pps.
    kernel_unit_pps: float | None = None
    # The switch's rates per CPU second of its own process (reports since 2026-12-08): what
    # one packet costs the shared cores. BMv2 alone carries more a second than that (its
    # threads use more than one core), which the emulation's busy cores do not allow. None:
    # the rates above.
    switch_agg_cpu_pps: float | None = None
    switch_fwd_cpu_pps: float | None = None


# Two calibration lines of earlier `make bench` runs (docs/benchmarks.md, Results, in git),
# fixed machines for the tests; a simulation of a report reads the report's own line.
CALIBRATIONS: dict[str, dict[str, Calibration]] = {
    "2026-12-05 00:45": {"model": Calibration(300569, 175142, 211714),
                         "bmv2": Calibration(4159, 20269, 211714)},
    "2026-12-04 21:51": {"model": Calibration(263143, 166034, 181468),
                         "bmv2": Calibration(3783, 21745, 181468)},
}

# Constants that no calibration measures, each with what it was fitted to or read from:
# sim/fitted.json, which `python -m sim fit --write` rewrites. None is fitted to the report
# that `python -m sim validate` compares with.
FITTED_FILE = Path(__file__).with_name("fitted.json")
FITTED: dict[str, tuple[float, str]] = {
    name: (entry["value"], entry["source"])
    for name, entry in json.loads(FITTED_FILE.read_text()).items()}


def write_fitted(values: dict[str, float], sources: dict[str, str]) -> None:
    """Replace some constants of sim/fitted.json, each with where it now comes from."""
    data = json.loads(FITTED_FILE.read_text())
    for name, value in values.items():
        data[name] = {"value": value, "source": sources[name]}
    FITTED_FILE.write_text(json.dumps(data, indent=2) + "\n")


def fitted(name: str, overrides: dict[str, float] | None = None) -> float:
    return (overrides or {}).get(name, FITTED[name][0])


@dataclass(frozen=True)
class Costs:
    """Everything but the links. Rates None: not a limit in this regime."""

    name: str
    switch_agg_pps: float | None  # aggregation packets/s of one switch
    switch_fwd_pps: float | None  # forwarded frames/s of one switch (TCP strategies)
    agent_pps: float | None  # packets/s one agent stream sends and gets back
    # The in-host stage. PASSING's local reduce and broadcast (shared memory in the emulation,
    # NVLink or PCIe in a server) cross a per-host bus of `local_gbps`; the TCP strategies'
    # messages between ranks of one host (gloo over loopback in the emulation) cross the same
    # bus at `loopback_gbps`.
    local_gbps: float
    loopback_gbps: float
    # Per message of a TCP strategy (a ring step, a parameter-server chunk): gloo's own cost
    # and the round trip it waits for, which the flow model does not see.
    step_s: float
    # Per local reduce or broadcast of a gloo strategy (hier-ring): gloo's own cost of a
    # collective between a host's ranks, beyond the bytes on its bus.
    local_op_s: float
    # The emulation's shared CPU: cores all processes share (0: every host and switch has its
    # own, none modelled), and the kernel's CPU per frame per link it crosses.
    machine_cores: int = 0
    frame_cpu_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def shared_cpu(self) -> bool:
        return self.machine_cores > 0


def emulation(cal: Calibration, constants: dict[str, float] | None = None) -> Costs:
    """The Mininet fabric on this machine at the hour of `cal`; `constants` replace FITTED's
    values (what `python -m sim fit` tries). A switch's packets cost the CPU time they took it
    in the calibration (its rate per CPU second, where the report has it): every process
    shares the machine's cores here."""
    return Costs(
        name="emulation",
        switch_agg_pps=min(cal.switch_agg_pps, cal.switch_agg_cpu_pps or cal.switch_agg_pps),
        switch_fwd_pps=min(cal.switch_fwd_pps, cal.switch_fwd_cpu_pps or cal.switch_fwd_pps),
        agent_pps=cal.agent_pps,
        local_gbps=fitted("shm_gbps", constants),
        loopback_gbps=fitted("loopback_gbps", constants),
        step_s=fitted("gloo_step_s", constants),
        local_op_s=fitted("gloo_local_s", constants),
        machine_cores=cal.cores,
        frame_cpu_s=fitted("frame_cpu_fwd", constants)
        / (cal.kernel_unit_pps or cal.switch_fwd_pps),
    )


# Per-GPU in-host rates, GB/s one way: NVLink 4 through NVSwitch (H100: 900 GB/s both ways, each
# GPU its own port, so the bus is G ports wide) and PCIe 4.0 x16 (~25 GB/s achieved, the GPUs
# behind one host bridge share it).
IN_HOST = {"nvlink": (450.0, True), "pcie": (25.0, False)}


def datacenter(in_host: str = "nvlink", gpus: int = 1, step_s: float = 10e-6) -> Costs:
    """Servers with GPUs, switch ASICs at line rate, agents at NIC rate."""
    if in_host not in IN_HOST:
        raise ValueError(f"in-host stage {in_host!r}: choose {', '.join(IN_HOST)}")
    gbytes, per_gpu = IN_HOST[in_host]
    bus_gbps = gbytes * 8 * (gpus if per_gpu else 1)
    return Costs(
        name=f"datacenter-{in_host}",
        switch_agg_pps=None,
        switch_fwd_pps=None,
        agent_pps=None,
        local_gbps=bus_gbps,
        loopback_gbps=bus_gbps,
        step_s=step_s,
        local_op_s=step_s,
        notes=(f"in-host stage over {in_host}: {bus_gbps / 8:g} GB/s per server",),
    )
