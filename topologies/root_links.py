"""Links in the root namespace that a start finds already there: what a crashed or killed run
left (its Mininet switches' ports, the management bridge), removed before a network of the
same names is built."""

from __future__ import annotations

import subprocess


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name],
                          capture_output=True).returncode == 0


def remove_stale(names: list[str]) -> list[str]:
    """Delete those of `names` that exist in this (the root) namespace; the ones deleted.
    Called under the network lock (topologies/exclusive.py): no other PASSING network runs,
    so a link of these names is a dead run's. Deleting one end of a veth pair deletes both,
    so a name already gone with its peer is skipped."""
    removed = []
    for name in names:
        if not link_exists(name):
            continue
        out = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True)
        if out.returncode != 0 and link_exists(name):
            raise RuntimeError(f"interface {name}, left by an earlier run, cannot be removed: "
                               f"{out.stderr.strip()}; try `make stop`")
        removed.append(name)
    return removed
