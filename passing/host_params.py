"""One host of a job as its agent needs it (passing.contract's JobParams holds one per host),
and the checks every field of the contract goes through."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, fields
from typing import Any

from passing import protocol as P

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class ParamsError(ValueError):
    """Agent parameters that cannot be used; the message names the field and says why."""


def check_int(where: str, value: Any, low: int, high: int) -> None:
    """ParamsError naming `where` unless value is an integer in low..high."""
    # bool is an int in Python, but `true` for a port is a broken file, not port 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ParamsError(f"{where}: {value!r} is not an integer")
    if not low <= value <= high:
        raise ParamsError(f"{where}: {value} outside {low}..{high}")


def check_ipv4(where: str, value: Any) -> None:
    """ParamsError naming `where` unless value is an IPv4 address."""
    try:
        ipaddress.IPv4Address(value)
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise ParamsError(f"{where}: {value!r} is not an IPv4 address") from None


@dataclass(frozen=True)
class HostParams:
    """One host of the job, as its agent needs it."""

    name: str
    host_ip: str  # the address the agent sends from and receives results on
    switch_ip: str  # its ToR, where contributions are sent
    # Its ToR's MAC: switches do not answer ARP, so a host needs a static entry for switch_ip.
    switch_mac: str
    # This host's contributor id at its ToR; in mode `ina`, the first of local_gpus
    # consecutive ids (local rank i streams as contributor_id + i).
    contributor_id: int
    local_gpus: int  # local ranks: in `ina` each is a stream; in `passing` they pre-aggregate

    def __post_init__(self) -> None:
        where = f"hosts.{self.name}"
        if not isinstance(self.name, str) or not self.name:
            raise ParamsError(f"hosts: host name {self.name!r} is not a non-empty string")
        check_ipv4(f"{where}.host_ip", self.host_ip)
        check_ipv4(f"{where}.switch_ip", self.switch_ip)
        if not isinstance(self.switch_mac, str) or not _MAC.match(self.switch_mac.lower()):
            raise ParamsError(f"{where}.switch_mac: {self.switch_mac!r} is not a MAC address "
                              "(aa:bb:cc:dd:ee:ff)")
        check_int(f"{where}.contributor_id", self.contributor_id, 0, P.MAX_FAN_IN - 1)
        check_int(f"{where}.local_gpus", self.local_gpus, 1, P.MAX_FAN_IN)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}
