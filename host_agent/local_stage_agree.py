"""Step 2 of the local stage's call (host_agent.local_stage): whether every local rank called
alike and shares the file, over the ranks' channel or, before it exists and whenever a mapping
is made, in an all-reduce over the group; and the channel made in the call that makes the
first mapping. The module text of host_agent.local_stage tells the protocol whole.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from host_agent import local_channel
from host_agent.local_channel import READY, STATUS, VERDICT, ChannelBroken
from host_agent.local_stage_links import MISMATCH, LeaderLinks, pack_status, unpack_status
from host_agent.local_stage_memory import SharedMapping

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# numel, dtype code, generation, made a new mapping, elements per region before this call
_READY = struct.Struct("<qBIBq")
MISMATCH_TEXT = (
    "the local ranks called allreduce with different sizes or dtypes (or one of them failed in "
    "an earlier call): every local rank must sum the same tensor shape, in the same order")


class LocalStageMismatch(RuntimeError):
    """The local ranks did not call with the same size and dtype (or are out of step)."""


@dataclass(frozen=True)
class Call:
    """What this rank says of its call (READY): alike on every rank, or a mismatch."""

    numel: int
    dtype: torch.dtype
    gen: int  # the mapping's generation after put
    remapped: bool  # this call needed a new mapping
    before: int  # elements per region before this call
    failed: int  # 1: this rank could not make the call's new mapping
    token: int  # this rank's token of a mapping made in this call, else 0

    def ready(self) -> bytes:
        return _READY.pack(self.numel, DTYPES.index(self.dtype) + 1, self.gen, self.remapped,
                           self.before)


class Agreement:
    """The agreement of one rank of a group of `size` local ranks. LocalStageMismatch from
    either way: the caller gives the mapping up on every rank."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, timeout: float):
        self.group, self.rank, self.size, self.timeout = group, rank, size, timeout
        self.channel_tried = False  # tried once, in the call that makes the first mapping
        self._listener: socket.socket | None = None

    def by_channel(self, call: Call, links: LeaderLinks) -> bool:
        """True: the call goes on in shared memory; False: every rank made a new mapping, and
        all meet in the all-reduce (tokens, and the ranks' failures to map). ChannelBroken if
        a rank's end is gone."""
        mine = call.ready()
        if self.rank != 0:
            links.send_to_leader(READY, mine)
            if not call.remapped:
                return True  # what the leader found comes with the status
            kind, payload = links.links[0].recv(VERDICT, STATUS)
            if kind == STATUS:  # the leader lost another rank (BROKEN)
                raise ChannelBroken(unpack_status(payload)[2])
            if payload != b"\x01":
                raise LocalStageMismatch(MISMATCH_TEXT)
            return False
        theirs = {}
        for r, link in links.links.items():
            theirs[r] = link.recv(READY)[1]
        if all(p == mine for p in theirs.values()):
            if call.remapped:
                links.tell(VERDICT, b"\x01")
            return not call.remapped
        for r, link in links.links.items():  # each as it waits: for a verdict or the status
            made = len(theirs[r]) == _READY.size and _READY.unpack(theirs[r])[3]
            link.send(*((VERDICT, b"\x00") if made else
                        (STATUS, pack_status(MISMATCH, 0, MISMATCH_TEXT))))
        raise LocalStageMismatch(MISMATCH_TEXT)

    def by_gloo(self, call: Call, mapping: SharedMapping, links: LeaderLinks,
                shared: bool) -> bool:
        """Whether the ranks may go on using the mapping (`shared` before the call): False if
        any rank failed to map, or this rank does not see every rank's token in the file (the
        ranks do not share it). Every rank decides alike."""
        code = DTYPES.index(call.dtype) + 1
        # What must be alike on every rank, each with its negation (maximum and minimum in one
        # all-reduce), then whether any rank failed to map, then every rank's token.
        alike = [call.numel, code, call.gen, int(call.remapped), call.before,
                 int(self.channel_tried)]
        mine = [v for a in alike for v in (a, -a)] + [call.failed]
        n = len(mine) - 1
        tokens = [0] * self.size
        tokens[self.rank] = call.token
        most = torch.tensor(mine + tokens, dtype=torch.int64)
        first = call.remapped and not self.channel_tried  # alike on every rank
        try:
            if first and self.rank == 0 and not call.failed:
                self._listener = local_channel.listen(mapping.channel_path, self.size + 4)
            try:
                dist.all_reduce(most, group=self.group, op=dist.ReduceOp.MAX)
            finally:
                if call.token:
                    # Every rank has opened the file by now (before its all-reduce), or the
                    # collective failed: its name may go either way (each rank removes it,
                    # in case they are on different machines).
                    mapping.unlink()
            total = [int(v) for v in most]
            if total[:n] != mine[:n]:
                raise LocalStageMismatch(MISMATCH_TEXT)
            if total[n]:  # some rank could not map: none uses the mapping
                shared = False
            elif call.token and shared and mapping.tokens() != total[n + 1:]:
                shared = False
            if first:
                self.channel_tried = True  # on every rank alike (checked above)
                if shared:
                    self._open_channel(total[n + 1:], call.token, mapping.channel_path, links)
        finally:
            if self._listener is not None:
                self._listener.close()
                mapping.channel_path.unlink(missing_ok=True)
                self._listener = None
        return shared

    def _open_channel(self, tokens: list[int], token: int, path: Path,
                      links: LeaderLinks) -> None:
        """Every rank, after the all-reduce that showed every rank's token: the channel for
        all ranks or for none (see the module text of host_agent.local_stage)."""
        link = None
        if self.rank == 0:
            ok = self._listener is not None
        else:
            link = local_channel.connect(path, self.rank, token, self.timeout)
            ok = link is not None
        failed = torch.tensor([0 if ok else 1], dtype=torch.int64)
        dist.all_reduce(failed, group=self.group, op=dist.ReduceOp.MAX)
        if int(failed[0]):
            if link is not None:
                link.close()
            return
        if self.rank == 0:
            listener, self._listener = self._listener, None
            links.links = local_channel.accept_all(listener, path, tokens, self.timeout) or {}
        elif local_channel.welcomed(link):
            links.links = {0: link}
        else:
            link.close()
