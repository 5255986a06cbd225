"""Reading one field of a topology file: each reader names the field it refuses."""

from __future__ import annotations

import ipaddress
import re

from controller.topology_model import LinkParams, TopologyError

_MAC = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")
_DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")


def obj(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def integer(d: dict, key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    if key not in d:
        if default is None:
            raise TopologyError(f"{where}.{key}: missing")
        return default
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise TopologyError(f"{where}.{key}: expected an integer in {lo}..{hi}, got {v!r}")
    return v


def link_params(d: dict, where: str) -> LinkParams:
    bw, delay, loss = d.get("bw"), d.get("delay"), d.get("loss", 0)
    if bw is not None and (not isinstance(bw, int | float) or bw <= 0):
        raise TopologyError(f"{where}.bw: expected Mbit/s > 0, got {bw!r}")
    if delay is not None and (not isinstance(delay, str) or not _DELAY.match(delay)):
        raise TopologyError(f"{where}.delay: expected e.g. \"0.5ms\", got {delay!r}")
    if not isinstance(loss, int | float) or not 0 <= loss < 100:
        raise TopologyError(f"{where}.loss: expected a percentage in [0, 100), got {loss!r}")
    return LinkParams(bw, delay, float(loss))


def address(d: dict, where: str, ip: str, mac: str) -> tuple[str, str]:
    """The node's "ip" and "mac", each the derived one (ip, mac) unless the file gives it."""
    ip = d.get("ip", ip)
    mac = str(d.get("mac", mac)).lower()
    try:
        ipaddress.IPv4Address(ip)
    except (ValueError, TypeError):
        raise TopologyError(f"{where}.ip: not an IPv4 address: {ip!r}") from None
    if not _MAC.match(mac):
        raise TopologyError(f"{where}.mac: not a MAC address: {mac!r}")
    return ip, mac
