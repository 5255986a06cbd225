"""The local stage's messages between the leader and the other local ranks over their channel
(host_agent.local_channel), once it is made: the leader's status and count to every rank, a
rank's word to the leader, and what happens when a rank's end is gone. A broken channel stays
broken: every later call raises, as gloo does once a rank of its group is gone.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

from host_agent import local_channel
from host_agent.local_channel import STATUS, ChannelBroken

_STATUS = struct.Struct("<BB")  # code, flag; the message follows (utf-8)
_TEXT_BYTES = 1024
# Status codes the local stage sends itself: a mismatch the leader found over the channel, and
# the leader's channel broken (a rank gone: said to every rank still there).
MISMATCH, BROKEN = 255, 254
OK = 0  # PassingAllreduce's code for a call whose result is in the result region
T = TypeVar("T")


def pack_status(code: int, flag: int, message: str) -> bytes:
    return _STATUS.pack(code, flag) + message.encode()[:_TEXT_BYTES]


def unpack_status(payload: bytes) -> tuple[int, int, str]:
    code, flag = _STATUS.unpack_from(payload)
    return code, flag, payload[_STATUS.size:].decode(errors="replace")


class LeaderLinks:
    """This rank's end of the channel: on the leader a link per other rank, on another rank
    its link to the leader (key 0); none before the channel is made or once it broke."""

    def __init__(self, rank: int):
        self.rank = rank
        self.links: dict[int, local_channel.Link] = {}
        self.broken: str | None = None  # why the channel cannot be used, once it cannot

    def check(self) -> None:
        """ChannelBroken if the channel broke in an earlier call."""
        if self.broken is not None:
            raise ChannelBroken(self.broken)

    def share_status(self, code: int, flag: int, message: str) -> tuple[int, int, str]:
        """The leader sends (code, flag, message) to every rank and returns it; another rank
        returns the leader's. ChannelBroken if a rank's end is gone (the others are told all
        the same); except that a rank found gone while the leader sends an OK status fails
        nobody's call: every rank still there has this call's result (the status reaches each
        before any is told BROKEN), so the leader keeps it too, and every rank fails from the
        next call on, naming the one gone."""
        if self.rank == 0:
            gone = self._send_all(STATUS, pack_status(code, flag, message))
            if gone is not None:
                self.mark_broken(str(gone))
                if code != OK:
                    raise gone
            return code, flag, message
        return self._hear(STATUS, unpack_status)

    def share_count(self, count: int) -> int:
        """The leader's `count` on every rank."""
        if self.rank == 0:
            self.tell(local_channel.COUNT, count.to_bytes(8, "little", signed=True))
            return count
        return self._hear(local_channel.COUNT,
                          lambda p: int.from_bytes(p, "little", signed=True))

    def send_to_leader(self, kind: int, payload: bytes) -> None:
        """Another rank: a message to the leader; if the leader is gone, ChannelBroken with
        what it said last, where that is why (a BROKEN status)."""
        link = self.links[0]
        try:
            link.send(kind, payload)
        except ChannelBroken:
            said = link.leftover()
            if said is not None and said[0] == STATUS and len(said[1]) >= _STATUS.size:
                raise ChannelBroken(unpack_status(said[1])[2]) from None
            raise

    def tell(self, kind: int, payload: bytes) -> None:
        """The leader: one message to every other rank, each told even if one is gone."""
        gone = self._send_all(kind, payload)
        if gone is not None:
            self.mark_broken(str(gone))
            raise gone

    def mark_broken(self, why: str) -> None:
        """The channel unusable from now on: the leader tells every rank still there why
        (best effort), then the connections close."""
        if self.broken is None:
            self.broken = why
        if self.rank == 0:
            self._send_all(STATUS, pack_status(BROKEN, 0, why))
        self.close()

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.links = {}

    def _send_all(self, kind: int, payload: bytes) -> ChannelBroken | None:
        """The leader: `payload` to every link; the first failure, if any (the rest still
        sent)."""
        gone = None
        for link in self.links.values():
            try:
                link.send(kind, payload)
            except ChannelBroken as e:
                gone = gone or e
        return gone

    def _hear(self, kind: int, decode: Callable[[bytes], T]) -> T:
        """Another rank: the leader's next message, of `kind`, decoded; ChannelBroken if
        the leader is gone or says it lost a rank (a BROKEN status)."""
        self.check()
        try:
            got, payload = self.links[0].recv(kind, STATUS)
            if got == STATUS and unpack_status(payload)[0] == BROKEN:
                raise ChannelBroken(unpack_status(payload)[2])
            if got != kind:
                raise ChannelBroken(f"the leader sent a status where {kind} was due")
        except ChannelBroken as e:
            self.mark_broken(str(e))
            raise
        return decode(payload)
