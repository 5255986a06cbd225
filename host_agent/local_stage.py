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

import os
from pathlib import Path

import torch
import torch.distributed as dist

from host_agent import local_channel
from host_agent.local_channel import ChannelBroken
from host_agent.local_stage_agree import DTYPES, Agreement, Call, LocalStageMismatch
from host_agent.local_stage_links import MISMATCH, LeaderLinks
from host_agent.local_stage_memory import SharedMapping

# Environment: "gloo" keeps gloo's reduce and broadcast for the local stage; a directory in
# PASSING_SHM_DIR replaces /dev/shm (tests give each rank its own to play unshared memory).
STAGE_ENV, DIR_ENV = "PASSING_LOCAL_STAGE", "PASSING_SHM_DIR"


def usable(group: dist.ProcessGroup, size: int, tensor: torch.Tensor) -> bool:
    """Whether a call on `tensor` may go through shared memory: CPU ranks in a gloo group of
    more than one (and `allowed`, agreed once, says the ranks may)."""
    if size < 2 or tensor.device.type != "cpu" or tensor.dtype not in DTYPES \
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
    run's session, job and host). It holds one call's state and hands each step to the
    mapping (local_stage_memory), the agreement (local_stage_agree) and the channel's
    messages (local_stage_links)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, name: str):
        self.group, self.rank, self.size, self.name = group, rank, size, name
        self.dir = Path(os.environ.get(DIR_ENV) or "/dev/shm")
        self.mapping = SharedMapping(self.dir, name, rank, size)
        self.fresh_token = 0  # this rank's token of a mapping made in this call, else 0
        self.failed = 0  # 1: this rank could not make this call's new mapping
        self.shared = True  # False: gloo for every call from now on
        self.numel = 0
        self.dtype = torch.float32
        self.remapped = False  # this call needed a new mapping
        self.before = 0  # the capacity this call found (alike on every rank, or a mismatch)
        self.timeout = local_channel.group_timeout(group)
        self.channel = LeaderLinks(rank)
        self.agreement = Agreement(group, rank, size, self.timeout)

    @property
    def gen(self) -> int:
        """Mappings made so far (every rank counts the same)."""
        return self.mapping.gen

    @property
    def capacity(self) -> int:
        """Elements each region of the current mapping holds."""
        return self.mapping.capacity

    @property
    def links(self) -> dict[int, local_channel.Link]:
        """The channel to the leader (its links to the others on the leader), once made."""
        return self.channel.links

    @property
    def broken(self) -> str | None:
        """Why the channel cannot be used, once it cannot."""
        return self.channel.broken

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
                self.mapping.grow(max(self.numel, 2 * self.capacity))
            except OSError:  # no /dev/shm, no room: said in agree, and gloo from then on
                self.failed = 1
                self.mapping.unlink()
            self.fresh_token = self.mapping.token  # (its name goes in agree)
            if self.failed:
                return
        if self.rank != 0:
            self.mapping.region(self.rank, self.numel).copy_(local_sum.view(-1))

    def agree(self) -> bool:
        """Step 2: True if this call's data is in the shared regions; False if the local
        stage must go through gloo (the ranks do not share the file). LocalStageMismatch if
        the ranks called differently: on every rank, or, where the leader found it over the
        channel, on the leader and those waiting for a verdict, the others seeing it in the
        status (MISMATCH). ChannelBroken if another rank's end of the channel is gone."""
        self.channel.check()
        call = Call(self.numel, self.dtype, self.gen, self.remapped, self.before, self.failed,
                    self.fresh_token)
        try:
            if self.links:
                try:
                    if self.agreement.by_channel(call, self.channel):
                        return True
                except ChannelBroken as e:
                    self.channel.mark_broken(str(e))
                    raise
            if not self.agreement.by_gloo(call, self.mapping, self.channel, self.shared):
                self._give_up()
        except LocalStageMismatch:
            self._abandon()
            raise
        return self.shared

    def share_status(self, code: int, flag: int, message: str) -> tuple[int, int, str]:
        """After the leader's part, over the channel (only where `links`): the leader sends
        (code, flag, message) to every rank and returns it; another rank returns the
        leader's (LeaderLinks.share_status tells which failures fail whose call)."""
        told = self.channel.share_status(code, flag, message)
        if self.rank != 0 and told[0] == MISMATCH:
            self._abandon()
        return told

    def share_count(self, count: int) -> int:
        """The leader's `count` on every rank, over the channel (only where `links`)."""
        return self.channel.share_count(count)

    def gather(self, local_sum: torch.Tensor) -> None:
        """Step 3, the leader: the other ranks' tensors added to its own (in rank order)."""
        flat = local_sum.view(-1)
        for r in range(1, self.size):
            flat.add_(self.mapping.region(r, self.numel))

    def publish(self, result: torch.Tensor) -> None:
        """The leader: the call's result (the tensor, in its dtype) for the other ranks."""
        self.mapping.result(self.numel, self.dtype).copy_(result.view(-1))

    def take(self, out: torch.Tensor) -> None:
        """A rank other than the leader, after an OK status: the result into `out`."""
        out.view(-1).copy_(self.mapping.result(self.numel, self.dtype))

    def close(self) -> None:
        """The mapping and the channel released (idempotent)."""
        self.mapping.close()
        self.channel.close()

    def _give_up(self) -> None:
        self.shared = False
        self.close()

    def _abandon(self) -> None:
        """A mismatch, found on every rank in the same call: the ranks' mappings may now
        differ in generation and size, so none is used again; every later call goes through
        gloo (whose collectives check their sizes). A file made in this call goes too."""
        if self.fresh_token:
            self.mapping.unlink()
        self._give_up()


def reduce_to_leader() -> dist.ReduceOptions:
    """The local group's reduce of the ranks' tensors onto the leader (local rank 0)."""
    opts = dist.ReduceOptions()
    opts.reduceOp, opts.rootRank = dist.ReduceOp.SUM, 0
    return opts


def from_leader() -> dist.BroadcastOptions:
    """The local group's broadcast from the leader."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts
