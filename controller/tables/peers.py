"""Table of the PeerRewrite control (p4src/include/peers.p4): peer_rewrite."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from controller.switch import SwitchConnection, Update


@dataclass(frozen=True)
class Peer:
    """How a job's packets leave through one port: to a member host or switch, or to the spine."""

    dst_mac: str
    src_mac: str
    dst_ip: str
    src_ip: str
    dst_port: int
    contributor: int


class PeerTables:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def peer_update(self, kind: int, job_id: int, egress_port: int, peer: Peer) -> Update:
        return self.sw.table_update(kind, "peer_rewrite",
                                    {"job_id": job_id, "egress_port": egress_port},
                                    "set_peer", asdict(peer))

    def peer_delete(self, job_id: int, egress_port: int) -> Update:
        return self.sw.table_update(Update.DELETE, "peer_rewrite",
                                    {"job_id": job_id, "egress_port": egress_port})

    def peers(self) -> dict[tuple[int, int], dict]:
        return {(r["match"]["job_id"], r["match"]["egress_port"]): r["params"]
                for r in self.sw.read_table("peer_rewrite")}
