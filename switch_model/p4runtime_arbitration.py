"""Arbitration of the P4Runtime service: the clients' StreamChannels, the primary among them
(the highest election id, as the P4Runtime specification has it) and the check that keeps a
client that is not primary from changing the switch, answered as BMv2's server answers."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Iterable, Iterator

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2

from switch_model.p4runtime_abort import Abort

log = logging.getLogger("switch_model.p4runtime")


class Arbitration:
    """The election among the StreamChannels of one device."""

    def __init__(self, device_id: int):
        self.device_id = device_id
        self._lock = threading.Lock()
        self._streams: dict[int, dict] = {}  # stream id -> {"election": (hi, lo), "q": Queue}
        self._ids = itertools.count(1)

    def check_device(self, device_id: int) -> None:
        """Abort (NOT_FOUND) unless `device_id` is this switch's."""
        if device_id != self.device_id:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"Invalid device id {device_id}")

    def check_primary(self, device_id: int, election_id: p4runtime_pb2.Uint128) -> None:
        """Abort unless a request with `election_id` comes from the primary client: NOT_FOUND
        for another device, PERMISSION_DENIED for a backup or where no client arbitrated."""
        self.check_device(device_id)
        with self._lock:
            primary = self._primary_election()
        if primary is None or (election_id.high, election_id.low) != primary:
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "Not primary")

    def stream(self, request_iterator: Iterable[p4runtime_pb2.StreamMessageRequest],
               context: grpc.ServicerContext) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        """One client's StreamChannel: its arbitration updates in, every client's primary or
        backup status out, until the client closes it; a primary that leaves hands over."""
        sid = next(self._ids)
        out: queue.Queue = queue.Queue()
        with self._lock:
            self._streams[sid] = {"election": None, "q": out}
        # Requests are read on their own thread, so a client that stops sending does not keep
        # the announcements of others' elections from reaching it.
        threading.Thread(target=self._read, args=(sid, request_iterator, out),
                         daemon=True).start()
        try:
            while True:
                item = out.get()
                if item is None:
                    break
                if isinstance(item, Abort):
                    context.abort(item.code, str(item))
                yield item
        finally:
            with self._lock:
                was_primary = self._streams[sid]["election"] == self._primary_election()
                del self._streams[sid]
                if was_primary:
                    self._announce()

    def _read(self, sid: int, request_iterator: Iterable[p4runtime_pb2.StreamMessageRequest],
              out: queue.Queue) -> None:
        try:
            for req in request_iterator:
                if req.HasField("arbitration"):
                    arb = req.arbitration
                    if arb.device_id != self.device_id:
                        out.put(Abort(grpc.StatusCode.NOT_FOUND,
                                      f"Invalid device id {arb.device_id}"))
                        return
                    election = (arb.election_id.high, arb.election_id.low)
                    with self._lock:
                        taken = [s["election"] for i, s in self._streams.items() if i != sid]
                        if election in taken:
                            out.put(Abort(grpc.StatusCode.INVALID_ARGUMENT,
                                          "Election id already in use by another client"))
                            return
                        self._streams[sid]["election"] = election
                        self._announce()
                elif req.HasField("packet"):
                    log.info("packet-out ignored: the PASSING program has no CPU port")
        except grpc.RpcError:
            pass
        finally:
            out.put(None)

    def _primary_election(self) -> tuple[int, int] | None:
        elections = [s["election"] for s in self._streams.values() if s["election"] is not None]
        return max(elections) if elections else None

    def _announce(self) -> None:
        primary = self._primary_election()
        for s in self._streams.values():
            if s["election"] is None:
                continue
            msg = p4runtime_pb2.StreamMessageResponse()
            msg.arbitration.device_id = self.device_id
            msg.arbitration.election_id.high, msg.arbitration.election_id.low = primary
            if s["election"] == primary:
                msg.arbitration.status.code = code_pb2.OK
                msg.arbitration.status.message = "Is primary"
            else:
                msg.arbitration.status.code = code_pb2.ALREADY_EXISTS
                msg.arbitration.status.message = "Is backup"
            s["q"].put(msg)
