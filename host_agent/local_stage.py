"""The local stage through shared memory: the CPU ranks of one server hand the leader their
tensors in a file under /dev/shm, and take the result from it, instead of gloo's reduce and
broadcast, which move every byte through the kernel's loopback TCP twice per rank.

At 80 Mbit/s links on the 2-core benchmark machine gloo's reduce and broadcast of 4 MiB took
15-50 ms of a 500 ms call, their spread delaying whole hosts' streams (docs/benchmarks.md).
Here each call costs one copy in and one out per rank, and two messages on a unix socket
between each rank and the leader (host_agent.local_channel), made when the first mapping is.

One call, every local rank (PassingAllreduce.allreduce):

1. `put(local_sum)`: a rank other than the leader copies its float32 tensor into its region
   of the mapping (made larger first if the call needs more room than the mapping has).
2. `agree()`: every rank other than the leader sends it READY (numel, dtype code, generation
   and size of the mapping it found, whether this call made a new one); the leader reads
   every READY and compares them with its own. All alike and no new mapping: the call goes
   on, nothing sent back (this is what tells the leader every region is written). All alike
   and every rank made a new mapping (the same call grew it on all): the leader answers
   VERDICT go, and all meet in the all-reduce below. Anything else: the leader answers each
   rank with a mismatch (VERDICT to one waiting for a verdict, STATUS to one waiting for the
   status), and every rank raises LocalStageMismatch or the status's error.
   Before the channel exists, and whenever a mapping is made, the ranks meet in an
   all-reduce (maximum) over the group of what READY carries and whether the channel was
   tried, each also negated (so the maximum of the negation is minus the minimum), whether
   the rank failed to map, and one column per rank for its token: every rank sees whether
   all called alike, and all decide alike. A mismatch, found either way, retires the stage
   on every rank in that call (gloo from then on: the ranks' mappings may differ).
3. The leader adds the regions to its own tensor (`gather`), streams, writes the result into
   the result region (`publish`), and sends every rank the status (`share_status`: over the
   channel, or the caller's gloo broadcast without one); on an OK status every other rank
   copies the result out (`take`).

Why a region is never read while being written: a rank writes its region for call n+1 only
after it has taken call n's result, which the leader publishes after it has read every
region of call n; the leader writes the result region of call n+1 only after the all-reduce
of call n+1, which no rank enters before it has taken call n's result.

Whether the ranks really share the file is checked whenever a mapping is made: each rank
writes a random token into its own header slot before the all-reduce that carries every
rank's token; a rank that reads every rank's token in its slots is looking at the same file
as all others (a rank sees all tokens only if every rank wrote into its file). The pages are
reserved when the file is made (posix_fallocate), so a /dev/shm too small for it is an
error then, answered like a missing one, not a SIGBUS at the first write. Where they do
not (ranks of one group on different machines, or in containers without a shared /dev/shm),
every rank finds a mismatch, the call's local stage goes through gloo after all, and so does
every later one: never a sum with a rank's data missing.

The channel is made in the call that makes the first mapping, once every rank has seen every
token: the leader listens beside the file before the all-reduce, the others connect and say
hello with their token after it, a second all-reduce says whether every rank connected, and
the leader then takes every rank's connection or none (local_channel.accept_all), and tells
each. Ranks that cannot (a directory where no socket can be made, a name too long) keep the
all-reduce and gloo's status broadcast. A rank whose channel breaks (the other end exited)
raises in this call and every later one, as gloo does once a rank of its group is gone.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
from pathlib import Path

import torch
import torch.distributed as dist

from host_agent import local_channel
from host_agent.local_channel import READY, STATUS, VERDICT, ChannelBroken

# Environment: "gloo" keeps gloo's reduce and broadcast for the local stage; a directory in
# PASSING_SHM_DIR replaces /dev/shm (tests give each rank its own to play unshared memory).
STAGE_ENV, DIR_ENV = "PASSING_LOCAL_STAGE", "PASSING_SHM_DIR"
SLOT_BYTES = 64  # per rank in the header: its token of the current mapping
_TOKEN_BITS = 62
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# numel, dtype code, generation, made a new mapping, elements per region before this call
_READY = struct.Struct("<qBIBq")
_STATUS = struct.Struct("<BB")  # code, flag; the message follows (utf-8)
_TEXT_BYTES = 1024
# Status codes the local stage sends itself: a mismatch the leader found over the channel, and
# the leader's channel broken (a rank gone: said to every rank still there).
MISMATCH, BROKEN = 255, 254
OK = 0  # PassingAllreduce's code for a call whose result is in the result region
_MISMATCH_TEXT = (
    "the local ranks called allreduce with different sizes or dtypes (or one of them failed in "
    "an earlier call): every local rank must sum the same tensor shape, in the same order")


class LocalStageMismatch(RuntimeError):
    """The local ranks did not call with the same size and dtype (or are out of step)."""


def usable(group: dist.ProcessGroup, size: int, tensor: torch.Tensor) -> bool:
    """Whether a call on `tensor` may go through shared memory: CPU ranks in a gloo group of
    more than one (and `allowed`, agreed once, says the ranks may)."""
    if size < 2 or tensor.device.type != "cpu" or tensor.dtype not in _DTYPES \
            or tensor.numel() == 0:
        return False
    return _is_gloo(group)


def _is_gloo(group: dist.ProcessGroup) -> bool:
    try:
        return dist.get_backend(group) == "gloo"
    except (RuntimeError, ValueError):
        return False


def allowed(group: dist.ProcessGroup, size: int) -> bool:
    """Whether the ranks of `group` may use shared memory at all: False if any of them has
    PASSING_LOCAL_STAGE=gloo. Every local rank calls it once, at its first call, on a gloo
    group of more than one (one all-reduce of a flag; else no collective, and False): each
    process reads its own environment, and ranks that chose differently would meet in
    different collectives (gloo's reduce against the stage's all-reduce), which can pair
    buffers of the same size and sum one rank's integers as another's floats."""
    if size < 2 or not _is_gloo(group):
        return False
    refuses = os.environ.get(STAGE_ENV, "").strip().lower() == "gloo"
    flag = torch.tensor([int(refuses)], dtype=torch.int64)
    dist.all_reduce(flag, group=group, op=dist.ReduceOp.MAX)
    return not int(flag[0])


class SharedLocalStage:
    """The shared-memory local stage of one group of local ranks (see the module's text).
    `name`: the same on every rank of the group and different from any other group's (the
    run's session, job and host)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, name: str):
        self.group, self.rank, self.size, self.name = group, rank, size, name
        self.dir = Path(os.environ.get(DIR_ENV) or "/dev/shm")
        self.gen = 0  # mappings made so far (every rank counts the same)
        self.capacity = 0  # elements each region of the current mapping holds
        self.map: mmap.mmap | None = None
        self.fresh_token = 0  # this rank's token of a mapping made in this call, else 0
        self.failed = 0  # 1: this rank could not make this call's new mapping
        self.shared = True  # False: gloo for every call from now on
        self.numel = 0
        self.dtype = torch.float32
        self.remapped = False  # this call needed a new mapping
        self.before = 0  # the capacity this call found (alike on every rank, or a mismatch)
        # The channel to the leader (its links to the others on the leader), once made; tried
        # once, in the call that makes the first mapping. `broken`: why it cannot be used.
        self.links: dict[int, local_channel.Link] = {}
        self.channel_tried = False
        self.broken: str | None = None
        self.timeout = local_channel.group_timeout(group)
        self._listener = None

    # -- layout: header, the other ranks' float32 inputs, the result in the tensor's dtype --
    # Each region holds `capacity` elements whatever a call's size, so a rank that calls with
    # a size the others do not (found only once its region is written) writes its own region
    # and nothing else: not the result another rank may still be copying out.
    def _input_at(self, rank: int, capacity: int | None = None) -> int:
        return self.size * SLOT_BYTES + (rank - 1) * (capacity or self.capacity) * 4

    def _result_at(self, capacity: int | None = None) -> int:
        return -(-self._input_at(self.size, capacity) // 64) * 64  # aligned for any dtype

    def _view(self, offset: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.frombuffer(self.map, dtype=dtype, count=self.numel, offset=offset)

    def put(self, local_sum: torch.Tensor, dtype: torch.dtype) -> None:
        """Step 1 for a call of `local_sum` (float32, contiguous) whose result has `dtype`."""
        self.numel, self.dtype = local_sum.numel(), dtype
        self.fresh_token = self.failed = 0
        self.remapped, self.before = False, self.capacity
        if not self.shared:
            return
        self.remapped = self.numel > self.capacity
        if self.remapped:
            try:
                self._remap(max(self.numel, 2 * self.capacity))
            except OSError:  # no /dev/shm, no room: said in agree, and gloo from then on
                self.failed = 1
                self._path().unlink(missing_ok=True)
                return
        if self.rank != 0:
            self._view(self._input_at(self.rank), torch.float32).copy_(local_sum.view(-1))

    def _remap(self, capacity: int) -> None:
        """A new, larger mapping (the next generation) of `capacity` elements per region,
        this rank's token in its slot."""
        self.gen += 1
        self._unmap()
        fd = os.open(self._path(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.fresh_token = secrets.randbits(_TOKEN_BITS) | 1  # (its name goes in agree)
        try:
            size = self._result_at(capacity) + capacity * 8
            os.posix_fallocate(fd, 0, size)
            new = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.map, self.capacity = new, capacity
        at = self.rank * SLOT_BYTES
        new[at:at + 8] = self.fresh_token.to_bytes(8, "little")

    def agree(self) -> bool:
        """Step 2: True if this call's data is in the shared regions; False if the local
        stage must go through gloo (the ranks do not share the file). LocalStageMismatch if
        the ranks called differently: on every rank, or, where the leader found it over the
        channel, on the leader and those waiting for a verdict, the others seeing it in the
        status (MISMATCH). ChannelBroken if another rank's end of the channel is gone."""
        if self.broken is not None:
            raise ChannelBroken(self.broken)
        if self.links:
            try:
                if self._agree_by_channel():
                    return True
            except ChannelBroken as e:
                self._break(str(e))
                raise
        return self._agree_by_gloo()

    def _agree_by_channel(self) -> bool:
        """True: the call goes on in shared memory; False: every rank made a new mapping,
        and all meet in the all-reduce (tokens, and the ranks' failures to map)."""
        mine = _READY.pack(self.numel, _DTYPES.index(self.dtype) + 1, self.gen, self.remapped,
                           self.before)
        if self.rank != 0:
            self._send_to_leader(READY, mine)
            if not self.remapped:
                return True  # what the leader found comes with the status
            kind, payload = self.links[0].recv(VERDICT, STATUS)
            if kind == STATUS:  # the leader lost another rank (BROKEN)
                raise ChannelBroken(_status(payload)[2])
            if payload != b"\x01":
                self._abandon()
                raise LocalStageMismatch(_MISMATCH_TEXT)
            return False
        theirs = {}
        for r, link in self.links.items():
            theirs[r] = link.recv(READY)[1]
        if all(p == mine for p in theirs.values()):
            if self.remapped:
                self._tell(VERDICT, b"\x01")
            return not self.remapped
        for r, link in self.links.items():  # each as it waits: for a verdict or the status
            made = len(theirs[r]) == _READY.size and _READY.unpack(theirs[r])[3]
            link.send(*((VERDICT, b"\x00") if made else
                        (STATUS, _STATUS.pack(MISMATCH, 0) + _MISMATCH_TEXT.encode())))
        self._abandon()
        raise LocalStageMismatch(_MISMATCH_TEXT)

    def _agree_by_gloo(self) -> bool:
        code = _DTYPES.index(self.dtype) + 1
        # What must be alike on every rank, each with its negation (maximum and minimum in one
        # all-reduce), then whether any rank failed to map, then every rank's token.
        alike = [self.numel, code, self.gen, int(self.remapped), self.before,
                 int(self.channel_tried)]
        mine = [v for a in alike for v in (a, -a)] + [self.failed]
        n = len(mine) - 1
        tokens = [0] * self.size
        tokens[self.rank] = self.fresh_token
        most = torch.tensor(mine + tokens, dtype=torch.int64)
        first = self.remapped and not self.channel_tried  # alike on every rank
        try:
            if first and self.rank == 0 and not self.failed:
                self._listener = local_channel.listen(self._channel_path(), self.size + 4)
            try:
                dist.all_reduce(most, group=self.group, op=dist.ReduceOp.MAX)
            finally:
                if self.fresh_token:
                    # Every rank has opened the file by now (before its all-reduce), or the
                    # collective failed: its name may go either way (each rank removes it,
                    # in case they are on different machines).
                    self._path().unlink(missing_ok=True)
            total = [int(v) for v in most]
            if total[:n] != mine[:n]:
                self._abandon()
                raise LocalStageMismatch(_MISMATCH_TEXT)
            if total[n]:  # some rank could not map: none uses the mapping
                self._give_up()
            elif self.fresh_token and self.shared:
                seen = [int.from_bytes(self.map[r * SLOT_BYTES:r * SLOT_BYTES + 8], "little")
                        for r in range(self.size)]
                if seen != total[n + 1:]:
                    self._give_up()
            if first:
                self.channel_tried = True  # on every rank alike (checked above)
                if self.shared:
                    self._open_channel(total[n + 1:])
        finally:
            if self._listener is not None:
                self._listener.close()
                self._channel_path().unlink(missing_ok=True)
                self._listener = None
        return self.shared

    def _open_channel(self, tokens: list[int]) -> None:
        """Every rank, after the all-reduce that showed every rank's token: the channel for
        all ranks or for none (see the module's text)."""
        path, link = self._channel_path(), None
        if self.rank == 0:
            ok = self._listener is not None
        else:
            link = local_channel.connect(path, self.rank, self.fresh_token, self.timeout)
            ok = link is not None
        failed = torch.tensor([0 if ok else 1], dtype=torch.int64)
        dist.all_reduce(failed, group=self.group, op=dist.ReduceOp.MAX)
        if int(failed[0]):
            if link is not None:
                link.close()
            return
        if self.rank == 0:
            listener, self._listener = self._listener, None
            self.links = local_channel.accept_all(listener, path, tokens, self.timeout) or {}
        elif local_channel.welcomed(link):
            self.links = {0: link}
        else:
            link.close()

    def share_status(self, code: int, flag: int, message: str) -> tuple[int, int, str]:
        """After the leader's part, over the channel (only where `links`): the leader sends
        (code, flag, message) to every rank and returns it; another rank returns the
        leader's. ChannelBroken if a rank's end is gone (the others are told all the same);
        except that a rank found gone while the leader sends an OK status fails nobody's call:
        every rank still there has this call's result (the status reaches each before any is
        told BROKEN), so the leader keeps it too, and every rank fails from the next call on,
        naming the one gone."""
        if self.rank == 0:
            gone = self._send_all(STATUS, _STATUS.pack(code, flag)
                                  + message.encode()[:_TEXT_BYTES])
            if gone is not None:
                self._break(str(gone))
                if code != OK:
                    raise gone
            return code, flag, message
        told = self._hear(STATUS, _status)
        if told[0] == MISMATCH:
            self._abandon()
        return told

    def share_count(self, count: int) -> int:
        """The leader's `count` on every rank, over the channel (only where `links`)."""
        if self.rank == 0:
            self._tell(local_channel.COUNT, count.to_bytes(8, "little", signed=True))
            return count
        return self._hear(local_channel.COUNT,
                          lambda p: int.from_bytes(p, "little", signed=True))

    def _send_to_leader(self, kind: int, payload: bytes) -> None:
        """Another rank: a message to the leader; if the leader is gone, ChannelBroken with
        what it said last, where that is why (a BROKEN status)."""
        link = self.links[0]
        try:
            link.send(kind, payload)
        except ChannelBroken:
            said = link.leftover()
            if said is not None and said[0] == STATUS and len(said[1]) >= _STATUS.size:
                raise ChannelBroken(_status(said[1])[2]) from None
            raise

    def _tell(self, kind: int, payload: bytes) -> None:
        """The leader: one message to every other rank, each told even if one is gone."""
        gone = self._send_all(kind, payload)
        if gone is not None:
            self._break(str(gone))
            raise gone

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

    def _hear(self, kind: int, decode):
        """Another rank: the leader's next message, of `kind`, decoded; ChannelBroken if
        the leader is gone or says it lost a rank (a BROKEN status)."""
        if self.broken is not None:
            raise ChannelBroken(self.broken)
        try:
            got, payload = self.links[0].recv(kind, STATUS)
            if got == STATUS and _status(payload)[0] == BROKEN:
                raise ChannelBroken(_status(payload)[2])
            if got != kind:
                raise ChannelBroken(f"the leader sent a status where {kind} was due")
        except ChannelBroken as e:
            self._break(str(e))
            raise
        return decode(payload)

    def _break(self, why: str) -> None:
        """This rank's channel is unusable from now on: the leader tells every rank still
        there why (best effort), then the connections close."""
        if self.broken is None:
            self.broken = why
        if self.rank == 0:
            self._send_all(STATUS, _STATUS.pack(BROKEN, 0) + why.encode()[:_TEXT_BYTES])
        self._close_links()

    def _close_links(self) -> None:
        for link in self.links.values():
            link.close()
        self.links = {}

    def _channel_path(self) -> Path:
        return self.dir / f"{self.name}.ch"

    def _path(self) -> Path:
        return self.dir / f"{self.name}-{self.gen}"

    def _give_up(self) -> None:
        self.shared = False
        self.close()

    def _abandon(self) -> None:
        """A mismatch, found on every rank in the same call: the ranks' mappings may now
        differ in generation and size, so none is used again; every later call goes through
        gloo (whose collectives check their sizes). A file made in this call goes too."""
        if self.fresh_token:
            self._path().unlink(missing_ok=True)
        self._give_up()

    def gather(self, local_sum: torch.Tensor) -> None:
        """Step 3, the leader: the other ranks' tensors added to its own (in rank order)."""
        flat = local_sum.view(-1)
        for r in range(1, self.size):
            flat.add_(self._view(self._input_at(r), torch.float32))

    def publish(self, result: torch.Tensor) -> None:
        """The leader: the call's result (the tensor, in its dtype) for the other ranks."""
        self._view(self._result_at(), self.dtype).copy_(result.view(-1))

    def take(self, out: torch.Tensor) -> None:
        """A rank other than the leader, after an OK status: the result into `out`."""
        out.view(-1).copy_(self._view(self._result_at(), self.dtype))

    def close(self) -> None:
        """The mapping and the channel released (idempotent)."""
        self._unmap()
        self._close_links()

    def _unmap(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        self.capacity = 0


def _status(payload: bytes) -> tuple[int, int, str]:
    code, flag = _STATUS.unpack_from(payload)
    return code, flag, payload[_STATUS.size:].decode(errors="replace")
