"""The in-host stage: a host's GPUs' tensors summed into its leader, and the result handed back.

Both cross the host's bus (sim.platform): the reduce as G-1 transfers of the tensor into the
leader at once, the broadcast as G-1 transfers out of it (each simulated as one transfer of
their bytes: on a shared bus that takes as long). What the bus is depends on the
regime and the strategy (sim.costs): NVLink or PCIe in a server; in the emulation, shared
memory for PASSING's local stage and gloo over loopback TCP for hier-ring's.
"""

from __future__ import annotations

from sim.context import SimContext


def local_reduce(ctx: SimContext, host: str, gpus: int, nbytes: float, op_s: float = 0.0) -> None:
    """`op_s`: the collective's own cost beyond its bytes (gloo's, for hier-ring)."""
    if gpus > 1:
        ctx.bus_async(host, (gpus - 1) * nbytes).wait()
    ctx.sleep(op_s)


def local_broadcast(ctx: SimContext, host: str, gpus: int, nbytes: float,
                    op_s: float = 0.0) -> None:
    if gpus > 1:
        ctx.bus_async(host, (gpus - 1) * nbytes).wait()
    ctx.sleep(op_s)
