"""The rate of a live Mininet link, set again without restarting the network: bench.sweep
measures several link rates on one fabric instead of starting a fresh one (switches, agents,
torch in every rank) for each.

The shaping is the one the network's links install at start (Mininet's TCLink: an htb root with
one class; its quantum set, see HTB_QUANTUM), so a re-shaped link is shaped exactly as a freshly
built one. Mininet's own TCIntf.config is not used for it: it also switches the interface's
checksum offloads back on, which the hosts need off (topologies/network.py) and the switches'
capture must not see (mininet_nodes.py). Every
change is read back from the kernel: a link that silently kept its old rate would put a wrong
bandwidth beside every number measured on it."""

from __future__ import annotations

import re

# tc prints rates with these units (and "bit" for the rest).
_UNITS = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}
_RATE = re.compile(r"\brate (\d+(?:\.\d+)?)([KMG]?)bit\b")
# The htb class's quantum, set rather than left to htb's rate / r2q: above 20 Mbit/s that is
# over 200,000 bytes, and tc warns ("quantum of class 50001 is big"), which Mininet prints as
# an "*** Error" per shaped interface at every start. With one class per interface the
# quantum shares nothing out, so its size changes no link's rate (it must be at least a frame).
HTB_QUANTUM = 15000
# Below this share of a shaped link's rate during a call, the link did not set the time: this
# machine's CPU (switch processes, agents) did. make run-topology and make bench both say so.
CPU_BOUND_BELOW = 0.5


def htb_class_options(mbps: float) -> str:
    """The htb class of a link shaped to `mbps` Mbit/s: Mininet's TCLink's (rate, burst 15k)
    and HTB_QUANTUM; mininet_nodes.QuietTCIntf and set_rate both use it."""
    return f"rate {mbps:f}Mbit burst 15k quantum {HTB_QUANTUM}"


def busy(bytes_per_call: float, seconds: float, mbps: float) -> float:
    """The share of a `mbps` link's rate that `bytes_per_call` bytes in `seconds` used."""
    return bytes_per_call * 8 / (seconds * mbps * 1e6)


def rate(intf) -> float | None:
    """The rate (Mbit/s) shaping Mininet interface `intf`, None when it is unshaped."""
    out = intf.node.cmd(f"tc class show dev {intf.name}")
    found = _RATE.search(out)
    return float(found.group(1)) * _UNITS[found.group(2)] if found else None


def set_rate(intf, mbps: float | None) -> None:
    """Shape `intf` to `mbps` Mbit/s (None or 0: unshaped), as TCLink does, and check it."""
    node = intf.node
    node.cmd(f"tc qdisc del dev {intf.name} root 2>/dev/null")
    said = ""  # whatever tc says, only the read-back decides
    if mbps:
        said = node.cmd(f"tc qdisc add dev {intf.name} root handle 5:0 htb default 1; "
                        f"tc class add dev {intf.name} parent 5:0 classid 5:1 htb "
                        f"{htb_class_options(mbps)}")
    got = rate(intf)
    if (got is None) != (not mbps) or (mbps and abs(got - mbps) > 0.01 * mbps):
        raise RuntimeError(f"{intf.name}: asked for {mbps or 'no'} Mbit/s shaping, the kernel "
                           f"has {got or 'none'}" + (f" (tc: {said.strip()})" if said.strip()
                                                     else ""))
