"""Table of the PeerRewrite control (p4src/include/peers.p4): peer_rewrite."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from controller.switch import SwitchConnection, Update


@dataclass(frozen=True)
class Peer:
    """How a job's packets leave through one port for one recipient: a member host's rank, a
    member switch, or the spine."""

    dst_mac: str
    src_mac: str
    dst_ip: str
    src_ip: str
    dst_port: int
    contributor: int


class PeerRewriteTables:
    def __init__(self, sw: SwitchConnection):
        self.sw = sw

    def peer_update(self, kind: int, job_id: int, egress_port: int, rid: int,
                    peer: Peer) -> Update:
        """rid: the recipient's contributor id (a multicast replica's rid, or the id a unicast
        answer goes back to); 0 for the uplink to the spine."""
        return self.sw.table_update(kind, "peer_rewrite",
                                    {"job_id": job_id, "egress_port": egress_port, "rid": rid},
                                    "set_peer", asdict(peer))

    def peer_delete(self, job_id: int, egress_port: int, rid: int) -> Update:
        return self.sw.table_update(Update.DELETE, "peer_rewrite",
                                    {"job_id": job_id, "egress_port": egress_port, "rid": rid})

    def peers(self) -> dict[tuple[int, int, int], dict]:
        """(job, egress port, rid) -> the set_peer parameters."""
        return {(r["match"]["job_id"], r["match"]["egress_port"], r["match"]["rid"]): r["params"]
                for r in self.sw.read_table("peer_rewrite")}
