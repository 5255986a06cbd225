"""Table of the L2Forward control (p4src/include/forwarding.p4): l2_forward and its flood group."""

from __future__ import annotations

from collections.abc import Iterable

from controller.switch import SwitchConnection, Update


class ForwardingTables:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def install(self, hosts: dict[str, int], flood_ports: Iterable[int], flood_group: int) -> None:
        """hosts: MAC -> port. Unknown destinations (and broadcast) flood to flood_ports."""
        updates = [self.sw.multicast_update(Update.INSERT, flood_group,
                                            [(p, 0) for p in sorted(set(flood_ports))])]
        updates += [self.sw.table_update(Update.INSERT, "l2_forward", {"dst_mac": mac},
                                         "l2_to_port", {"port": port})
                    for mac, port in hosts.items()]
        self.sw.write(updates)
        self.sw.set_default_action("l2_forward", "l2_flood", {"mcast_grp": flood_group})
