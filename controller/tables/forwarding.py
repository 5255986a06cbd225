"""Table of the L2Forward control (p4src/include/forwarding.p4): l2_forward and its flood group."""

from __future__ import annotations

from collections.abc import Iterable

from controller.switch import SwitchConnection, Update


def _mac(value: int) -> str:
    return ":".join(f"{value:012x}"[i:i + 2] for i in range(0, 12, 2))


class ForwardingTables:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def entries(self) -> dict[str, int]:
        return {_mac(r["match"]["dst_mac"]): r["params"].get("port")
                for r in self.sw.read_table("l2_forward")}

    def sync(self, hosts: dict[str, int], flood_ports: Iterable[int], flood_group: int) -> None:
        """Make the switch forward to each host MAC (-> port) and flood the rest to flood_ports.
        Only what differs is written, so this is safe to repeat."""
        have = self.entries()
        ups = []
        for mac, port in hosts.items():
            mac = mac.lower()
            if have.get(mac) != port:
                kind = Update.INSERT if mac not in have else Update.MODIFY
                ups.append(self.sw.table_update(kind, "l2_forward", {"dst_mac": mac},
                                                "l2_to_port", {"port": port}))
        replicas = [(p, 0) for p in sorted(set(flood_ports))]
        groups = self.sw.read_multicast_groups()
        if flood_group not in groups:
            ups.append(self.sw.multicast_update(Update.INSERT, flood_group, replicas))
        elif sorted(groups[flood_group]) != replicas:
            ups.append(self.sw.multicast_update(Update.MODIFY, flood_group, replicas))
        self.sw.write(ups)
        self.sw.set_default_action("l2_forward", "l2_flood", {"mcast_grp": flood_group})
