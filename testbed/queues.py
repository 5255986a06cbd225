"""An egress port made slow, so that its queue fills on either target: BMv2's own egress queue
(simple_switch_CLI set_queue_rate, in packets per second: that is the queue its enq_qdepth
reads), or, for the model, the link's kernel queue (a tbf qdisc on the switch's interface: that
is the queue the model reads with SIOCOUTQ)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from passing import protocol as P
from testbed.fabric import Fabric


def _bmv2_rate(fabric: Fabric, switch: str, port: int, pps: int) -> None:
    sw = fabric[switch]
    res = subprocess.run(["simple_switch_CLI", "--thrift-port", str(sw.thrift_port)],
                         input=f"set_queue_rate {pps} {port}\n", text=True,
                         capture_output=True, check=True)
    if "Error" in res.stdout:
        raise RuntimeError(f"{switch}: set_queue_rate {pps} {port}: {res.stdout.strip()}")


@contextmanager
def slow_egress(fabric: Fabric, switch: str, port: int, pps: int) -> Iterator[None]:
    """Within the block, `switch`'s `port` sends about `pps` full PASSING frames per second
    and queues the rest (up to BMv2's 64 packets, or the kernel's sndbuf for the model)."""
    if fabric.target == "bmv2":
        _bmv2_rate(fabric, switch, port, pps)
        try:
            yield
        finally:
            _bmv2_rate(fabric, switch, port, 0)  # 0: no limit, as started
        return
    ifname = fabric[switch].interfaces[port]
    rate = pps * P.FRAME_BYTES * 8
    subprocess.run(["tc", "qdisc", "replace", "dev", ifname, "root", "tbf", "rate",
                    f"{rate}bit", "burst", str(2 * P.FRAME_BYTES), "limit", str(4 << 20)],
                   check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", ifname, "root"], capture_output=True)
