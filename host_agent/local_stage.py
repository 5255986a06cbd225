"""The local stage through shared memory: the CPU ranks of one server hand the leader their
tensors in a file under /dev/shm, and take the result from it, instead of gloo's reduce and
broadcast, which move every byte through the kernel's loopback TCP twice per rank.

At 80 Mbit/s links on the 2-core benchmark machine gloo's reduce and broadcast of 4 MiB took
15-50 ms of a 500 ms call, their spread delaying whole hosts' streams (docs/benchmarks.md).
Here each call costs one collective of a few integers over the group and one copy in and
one out per rank.

One call, every local rank (PassingAllreduce.allreduce):

1. `put(local_sum)`: a rank other than the leader copies its float32 tensor into its region
   of the mapping (made larger first if the call needs more room than the mapping has).
2. `agree(...)`: an all-reduce (maximum) over the group of numel, dtype code and generation,
   each also negated (so the maximum of the negation is minus the minimum), whether the rank
   failed to map, and one column per rank for its token: from it every rank sees whether all
   called with the same size and dtype and are at the same generation of the mapping, and
   all decide alike (a mismatch raises everywhere). The all-reduce is also what tells the
   leader every region is written.
3. The leader adds the regions to its own tensor (`gather`), streams, writes the result into
   the result region (`publish`), and broadcasts the status, as before; on an OK status
   every other rank copies the result out (`take`).

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
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

import torch
import torch.distributed as dist

# Environment: "gloo" keeps gloo's reduce and broadcast for the local stage; a directory in
# PASSING_SHM_DIR replaces /dev/shm (tests give each rank its own to play unshared memory).
STAGE_ENV, DIR_ENV = "PASSING_LOCAL_STAGE", "PASSING_SHM_DIR"
SLOT_BYTES = 64  # per rank in the header: its token of the current mapping
_TOKEN_BITS = 62
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class LocalStageMismatch(RuntimeError):
    """The local ranks did not call with the same size and dtype (or are out of step)."""


def usable(group: dist.ProcessGroup, size: int, tensor: torch.Tensor) -> bool:
    """Whether a call on `tensor` may go through shared memory: CPU ranks in a gloo group of
    more than one, not turned off by PASSING_LOCAL_STAGE=gloo."""
    if size < 2 or tensor.device.type != "cpu" or tensor.dtype not in _DTYPES \
            or tensor.numel() == 0:
        return False
    if os.environ.get(STAGE_ENV, "").strip().lower() == "gloo":
        return False
    try:
        return dist.get_backend(group) == "gloo"
    except (RuntimeError, ValueError):
        return False


class SharedLocalStage:
    """The shared-memory local stage of one group of local ranks (see the module's text).
    `name`: the same on every rank of the group and different from any other group's (the
    run's session, job and host)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, name: str):
        self.group, self.rank, self.size, self.name = group, rank, size, name
        self.dir = Path(os.environ.get(DIR_ENV) or "/dev/shm")
        self.gen = 0  # mappings made so far (every rank counts the same)
        self.capacity = 0
        self.map: mmap.mmap | None = None
        self.fresh_token = 0  # this rank's token of a mapping made in this call, else 0
        self.failed = 0  # 1: this rank could not make this call's new mapping
        self.shared = True  # False: gloo for every call from now on
        self.numel = 0
        self.dtype = torch.float32

    # -- layout: header, the other ranks' float32 inputs, the result in the tensor's dtype --
    def _input_at(self, rank: int) -> int:
        return self.size * SLOT_BYTES + (rank - 1) * self.numel * 4

    def _result_at(self) -> int:
        return -(-self._input_at(self.size) // 64) * 64  # aligned for any dtype

    def _view(self, offset: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.frombuffer(self.map, dtype=dtype, count=self.numel, offset=offset)

    def put(self, local_sum: torch.Tensor, dtype: torch.dtype) -> None:
        """Step 1 for a call of `local_sum` (float32, contiguous) whose result has `dtype`."""
        self.numel, self.dtype = local_sum.numel(), dtype
        self.fresh_token = self.failed = 0
        if not self.shared:
            return
        need = self._result_at() + self.numel * 8
        if need > self.capacity:
            try:
                self._remap(max(need, 2 * self.capacity))
            except OSError:  # no /dev/shm, no room: said in agree, and gloo from then on
                self.failed = 1
                self._path().unlink(missing_ok=True)
                return
        if self.rank != 0:
            self._view(self._input_at(self.rank), torch.float32).copy_(local_sum.view(-1))

    def _remap(self, capacity: int) -> None:
        """A new, larger mapping (the next generation), this rank's token in its slot."""
        self.gen += 1
        self.close()
        fd = os.open(self._path(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.fresh_token = secrets.randbits(_TOKEN_BITS) | 1  # (its name goes in agree)
        try:
            os.posix_fallocate(fd, 0, capacity)
            new = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        self.map, self.capacity = new, capacity
        at = self.rank * SLOT_BYTES
        new[at:at + 8] = self.fresh_token.to_bytes(8, "little")

    def agree(self) -> bool:
        """Step 2: True if this call's data is in the shared regions; False if the local
        stage must go through gloo (the ranks do not share the file). LocalStageMismatch on
        every rank if the ranks called differently."""
        code = _DTYPES.index(self.dtype) + 1
        mine = [self.numel, -self.numel, code, -code, self.gen, -self.gen, self.failed]
        tokens = [0] * self.size
        tokens[self.rank] = self.fresh_token
        most = torch.tensor(mine + tokens, dtype=torch.int64)
        try:
            dist.all_reduce(most, group=self.group, op=dist.ReduceOp.MAX)
        finally:
            if self.fresh_token:
                # Every rank has opened the file by now (before its all-reduce), or the
                # collective failed: its name may go either way (each rank removes it, in
                # case they are on different machines).
                self._path().unlink(missing_ok=True)
        total = [int(v) for v in most]
        if total[:6] != mine[:6]:
            raise LocalStageMismatch(
                "the local ranks called allreduce with different sizes or dtypes (or one of "
                "them failed in an earlier call): every local rank must sum the same tensor "
                "shape, in the same order")
        if total[6]:  # some rank could not map: none uses the mapping
            self._give_up()
        elif self.fresh_token and self.shared:
            seen = [int.from_bytes(self.map[r * SLOT_BYTES:r * SLOT_BYTES + 8], "little")
                    for r in range(self.size)]
            if seen != total[7:]:
                self._give_up()
        return self.shared

    def _path(self) -> Path:
        return self.dir / f"{self.name}-{self.gen}"

    def _give_up(self) -> None:
        self.shared = False
        self.close()

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
        if self.map is not None:
            self.map.close()
            self.map = None
        self.capacity = 0
