"""Random loss on a Mininet link's interfaces, by nftables (this kernel has no netem).

A rule is a netdev table with an egress hook on one interface. Such a table outlives the
interface: the kernel hooks it again onto the next interface of that name. Mininet names
interfaces the same way every run (tor1-eth1, ...), so a table left behind would silently drop
frames of every later run. Tables in the root namespace (the switches' side) are therefore
named with TABLE_PREFIX, removed when the network stops, removed for every interface a network
is about to use when it starts, and by `make stop`. Tables in a host's namespace go with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

TABLE_PREFIX = "passing_loss_"
# Before the prefix, tables were named loss_<interface>: a network still removes those for its
# own interfaces, left by an older version.
LEGACY_PREFIX = "loss_"


def table_name(ifname: str) -> str:
    return TABLE_PREFIX + ifname.replace("-", "_")


def _legacy_name(ifname: str) -> str:
    return LEGACY_PREFIX + ifname.replace("-", "_")


def set_loss(intf, percent: float, run_dir: Path) -> bool:
    """Drop `percent` % of the frames leaving Mininet interface `intf` (0 removes the rule).
    True when a rule is now in place."""
    table = table_name(intf.name)
    node = intf.node
    node.cmd(f"nft delete table netdev {table} 2>/dev/null")
    if percent <= 0:
        return False
    rules = Path(run_dir) / f"{table}.nft"
    rules.write_text(f"table netdev {table} {{\n  chain c {{\n"
                     f"    type filter hook egress device \"{intf.name}\" priority 0;\n"
                     f"    numgen random mod 10000 < {int(round(percent * 100))} drop\n"
                     f"  }}\n}}\n")
    out = node.cmd(f"nft -f {rules}")
    if out.strip():
        raise RuntimeError(f"nft on {intf.name}: {out.strip()}")
    return True


def _netdev_tables() -> list[str]:
    res = subprocess.run(["nft", "list", "tables", "netdev"], capture_output=True, text=True)
    if res.returncode != 0:
        return []  # no nftables: there can be no table either
    return [line.split()[-1] for line in res.stdout.splitlines() if line.startswith("table")]


def root_tables() -> list[str]:
    """This project's loss tables in the root namespace."""
    return [n for n in _netdev_tables() if n.startswith(TABLE_PREFIX)]


def remove_root_tables(ifnames: list[str] | None = None) -> list[str]:
    """Delete the root namespace's loss tables of `ifnames` (also under the older names), or
    all of this project's with None; the names deleted."""
    wanted = None if ifnames is None else \
        {f(n) for n in ifnames for f in (table_name, _legacy_name)}
    gone = []
    for name in _netdev_tables():
        if (name in wanted) if wanted is not None else name.startswith(TABLE_PREFIX):
            subprocess.run(["nft", "delete", "table", "netdev", name], capture_output=True)
            gone.append(name)
    return gone
