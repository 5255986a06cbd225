"""The controller's P4Runtime sessions with the switches of a topology, one per switch, opened
when first needed and kept until given up."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controller.errors import SwitchUnreachable
from controller.switch import SwitchConnection, SwitchError


@dataclass(frozen=True)
class Endpoint:
    name: str
    address: str
    device_id: int
    # The switch's own tools load its program (Tofino's bf_switchd): the controller pushes
    # none there and drives what runs when its tables and counters are PASSING's.
    preloaded: bool = False


class SwitchConnections:
    """A session per switch of `endpoints`, each opened on first use with `retries` attempts
    and exponential backoff, mastership under `election_id`, and every message appended to
    `dump_dir`/<switch>-p4runtime.log when that is given."""

    def __init__(self, endpoints: dict[str, Endpoint], election_id: tuple[int, int] = (0, 10),
                 connect_timeout: float = 5.0, retries: int = 3, dump_dir: Path | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.endpoints = endpoints
        self.election_id = election_id
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.dump_dir = dump_dir
        self._sleep = sleep
        self._conns: dict[str, SwitchConnection] = {}

    @property
    def connected(self) -> list[str]:
        """The switches a session is open with now."""
        return list(self._conns)

    def conn(self, name: str) -> SwitchConnection:
        """A connection to switch `name`, retried with exponential backoff."""
        if name in self._conns:
            return self._conns[name]
        ep = self.endpoints[name]
        delay, last = 0.5, None
        for attempt in range(self.retries):
            try:
                dump = self.dump_dir / f"{name}-p4runtime.log" if self.dump_dir else None
                c = SwitchConnection(name, ep.address, ep.device_id, self.election_id, dump,
                                     self.connect_timeout)
                c.fetch_pipeline()  # names and ids of what it runs, if it runs anything
                self._conns[name] = c
                return c
            except SwitchError as e:
                last = e
                if attempt + 1 < self.retries:
                    self._sleep(delay)
                    delay *= 2
        raise SwitchUnreachable(f"{last} (tried {self.retries} times)")

    def disconnect(self) -> None:
        """Give up the switch sessions (and mastership), e.g. while idle, so that another
        controller process (passing-ctl in another shell) can take them."""
        for c in self._conns.values():
            c.close()
        self._conns.clear()
