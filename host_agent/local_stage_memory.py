"""The file of shared memory the local ranks of one server share for the local stage
(host_agent.local_stage), and its layout: a header of one slot per rank (its token of the
current mapping), the other ranks' float32 inputs, the result in the tensor's dtype.

Each region holds `capacity` elements whatever a call's size, so a rank that calls with a size
the others do not (found only once its region is written) writes its own region and nothing
else: not the result another rank may still be copying out. A call that needs more room makes
a new file, the next generation, under a new name: a rank never maps a file that another rank
of an older generation is still reading.
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

import torch

SLOT_BYTES = 64  # per rank in the header: its token of the current mapping
_TOKEN_BITS = 62
_ALIGN = 64  # the result region's start, for any dtype


class SharedMapping:
    """This rank's mapping of the group's file in `directory` (`name`: the group's)."""

    def __init__(self, directory: Path, name: str, rank: int, size: int):
        self.dir, self.name, self.rank, self.size = directory, name, rank, size
        self.gen = 0  # mappings made so far (every rank counts the same)
        self.capacity = 0  # elements each region of the current mapping holds
        self.map: mmap.mmap | None = None
        # This rank's token, written in its slot of the mapping grow made last (0 if grow
        # failed before it had a file to write it in).
        self.token = 0

    @property
    def path(self) -> Path:
        return self.dir / f"{self.name}-{self.gen}"

    @property
    def channel_path(self) -> Path:
        """Where the leader listens for the ranks' channel (host_agent.local_channel): beside
        the file, so that it is as private to the group as the file is."""
        return self.dir / f"{self.name}.ch"

    def grow(self, capacity: int) -> None:
        """A new mapping, the next generation, of `capacity` elements per region, this rank's
        new token in its slot. OSError if the file cannot be made or has no room (its pages
        are reserved now, so a full /dev/shm fails here, not with a SIGBUS at a write)."""
        self.gen += 1
        self.token = 0
        self.close()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.token = secrets.randbits(_TOKEN_BITS) | 1
        try:
            size = self._result_at(capacity) + capacity * 8
            os.posix_fallocate(fd, 0, size)
            new = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.map, self.capacity = new, capacity
        at = self.rank * SLOT_BYTES
        new[at:at + 8] = self.token.to_bytes(8, "little")

    def tokens(self) -> list[int]:
        """Every rank's token as this rank's mapping holds them."""
        return [int.from_bytes(self.map[r * SLOT_BYTES:r * SLOT_BYTES + 8], "little")
                for r in range(self.size)]

    def unlink(self) -> None:
        """The current generation's name removed (the mappings stay)."""
        self.path.unlink(missing_ok=True)

    def region(self, rank: int, numel: int) -> torch.Tensor:
        """The float32 input region of `rank` (not the leader's: it has none), `numel` long."""
        return self._view(self._input_at(rank), numel, torch.float32)

    def result(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The result region, `numel` elements of `dtype`."""
        return self._view(self._result_at(), numel, dtype)

    def close(self) -> None:
        """The mapping released (idempotent); the file's name is left to unlink."""
        if self.map is not None:
            self.map.close()
            self.map = None
        self.capacity = 0

    def _view(self, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        # A view past the region would reach the next rank's region or the result.
        if self.map is None or numel > self.capacity:
            raise ValueError(f"{numel} elements do not fit a region of {self.capacity}")
        return torch.frombuffer(self.map, dtype=dtype, count=numel, offset=offset)

    def _input_at(self, rank: int, capacity: int | None = None) -> int:
        return self.size * SLOT_BYTES + (rank - 1) * (capacity or self.capacity) * 4

    def _result_at(self, capacity: int | None = None) -> int:
        return -(-self._input_at(self.size, capacity) // _ALIGN) * _ALIGN
