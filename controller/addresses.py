"""Derived addresses of a topology's hosts and switches (used where a file gives no "ip"/"mac").

Every derived address lies in 10.0.0.0/8, the hosts' on-link prefix in Mininet, so any two hosts
reach each other without a router whatever their racks.

- A topology of at most 253 hosts and switch indexes: host i of the file (from 1) is
  10.0.<rack's switch index>.<i>, MAC 08:00:00:00:<rack>:<i>; switch d is 10.0.<d>.254. These are
  the shipped topologies' addresses and stay as they were.
- A larger one: host j of its rack (from 1, in file order) of the rack with switch index r is
  10.<1 + r // 256>.<r % 256>.<j>, MAC 08:00:01:<r, two bytes>:<j>: the rack in the address,
  as a data-center's per-rack subnets have it, and room for 253 hosts per rack and 32,767 racks.
  A rack of more than 253 hosts needs addresses written in the file.
- Switch d (any size) is 10.0.<d>.254 up to d = 255, else 10.<128 + d // 256>.<d % 256>.254;
  MAC 08:00:00:<d, two bytes>:fe. No host plan reaches .254, so no host has a switch's address.
"""

from __future__ import annotations

# .254 is the switches' and .255 the broadcast address of every /24 these plans use.
PER_BLOCK = 253


class AddressPlanError(ValueError):
    pass


def is_small(hosts: int, largest_switch_index: int) -> bool:
    """Whether the shipped plan (10.0.<rack>.<i>) holds this many hosts and switches."""
    return hosts <= PER_BLOCK and largest_switch_index <= PER_BLOCK


def host_address(small: bool, index: int, rack_index: int, in_rack: int) -> tuple[str, str]:
    """(ip, mac) of the host `index` of the file (from 1), the `in_rack`-th of the rack whose
    ToR has switch index `rack_index`."""
    if small:
        return (f"10.0.{rack_index}.{index}",
                f"08:00:00:00:{rack_index:02x}:{index:02x}")
    if in_rack > PER_BLOCK:
        raise AddressPlanError(f"more than {PER_BLOCK} hosts in one rack: derived addresses "
                               "hold 253 per rack; give this host an \"ip\" and a \"mac\"")
    if rack_index >= 127 * 256:
        raise AddressPlanError("more than 32,511 racks: give the hosts \"ip\" and \"mac\"")
    hi, lo = divmod(rack_index, 256)
    return f"10.{1 + hi}.{lo}.{in_rack}", f"08:00:01:{hi:02x}:{lo:02x}:{in_rack:02x}"


def switch_address(index: int) -> tuple[str, str]:
    """(ip, mac) of the switch with index `index` (its position in the file, from 0)."""
    hi, lo = divmod(index, 256)
    if hi >= 127:
        raise AddressPlanError("more than 32,511 switches: give the switches \"ip\" and \"mac\"")
    ip = f"10.0.{lo}.254" if hi == 0 else f"10.{128 + hi}.{lo}.254"
    return ip, f"08:00:00:{hi:02x}:{lo:02x}:fe"
