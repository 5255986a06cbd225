"""One of two processes of tests/host_agent/test_delegated.py: a `passing` process group that
only delegates (no job, no switch), driven straight from Python as c10d's front end drives it,
many times over. Every result is checked; the first wrong one, or a collective that does not
finish within the group's timeout, ends the process with a non-zero status."""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from host_agent.backend import AllgatherOptions, PassingProcessGroup

WORLD = 2


def expect(ok: bool, what: str) -> None:
    if not ok:
        sys.exit(f"rank {RANK}: {what}")


def one_round(pg: PassingProcessGroup, i: int) -> None:
    # all_gather_object's pattern: outputs are views the caller drops right after the call,
    # so gloo's worker frees the last references to their Python objects.
    sizes = torch.zeros(WORLD, dtype=torch.long)
    outs = [sizes[r].unsqueeze(0) for r in range(WORLD)]
    pg.allgather([outs], [torch.tensor([10 * RANK + i])]).wait()
    expect(sizes.tolist() == [i, 10 + i], f"allgather {i}: {sizes.tolist()}")
    t = torch.full((3,), float(RANK + i))
    pg.broadcast([t], dist.BroadcastOptions()).wait()
    expect(t.tolist() == [float(i)] * 3, f"broadcast {i}: {t.tolist()}")
    got = torch.zeros(1)
    parts = [torch.full((1,), float(100 * RANK + r + i)) for r in range(WORLD)]
    pg.reduce_scatter([got], [parts], dist.ReduceScatterOptions()).wait()
    expect(got.item() == sum(100 * r + RANK + i for r in range(WORLD)), f"reduce_scatter {i}")
    out = torch.zeros(WORLD)
    pg.alltoall_base(out, torch.arange(WORLD, dtype=torch.float32) + 10 * RANK + i, [], [],
                     dist.AllToAllOptions()).wait()
    expect(out.tolist() == [10 * r + RANK + i for r in range(WORLD)], f"alltoall {i}")
    peer = 1 - RANK
    msg = torch.full((2,), float(RANK * 1000 + i))
    if RANK == 0:
        pg.send([msg], peer, i).wait()
        pg.recv([msg], peer, i).wait()
    else:
        mine = msg.clone()
        pg.recv([msg], peer, i).wait()
        pg.send([mine], peer, i).wait()
    expect(msg.tolist() == [float(peer * 1000 + i)] * 2, f"send/recv {i}: {msg.tolist()}")
    pg.barrier(dist.BarrierOptions()).wait()


def coalesced(pg: PassingProcessGroup) -> None:
    ins = [torch.full((2,), float(RANK)), torch.full((1,), RANK + 0.5)]
    outs = [torch.zeros(2 * WORLD), torch.zeros(WORLD)]
    pg.allgather_into_tensor_coalesced(outs, ins, AllgatherOptions()).wait()
    expect(outs[0].tolist() == [0.0, 0.0, 1.0, 1.0] and outs[1].tolist() == [0.5, 1.5],
           f"allgather_into_tensor_coalesced: {outs}")
    ins = [torch.arange(2 * WORLD, dtype=torch.float32) + RANK, torch.full((WORLD,), 1.0)]
    outs = [torch.zeros(2), torch.zeros(1)]
    pg.reduce_scatter_tensor_coalesced(outs, ins, dist.ReduceScatterOptions()).wait()
    want = [float(2 * RANK * 2 + k * 2 + 1) for k in range(2)]
    expect(outs[0].tolist() == want and outs[1].tolist() == [2.0],
           f"reduce_scatter_tensor_coalesced: {outs} (want {want}, [2.0])")


if __name__ == "__main__":
    RANK, store_path, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    pg = PassingProcessGroup(dist.FileStore(store_path, WORLD), RANK, WORLD,
                             timedelta(seconds=20))
    t0 = time.monotonic()
    coalesced(pg)
    for i in range(rounds):
        one_round(pg, i)
    print(f"rank {RANK}: {rounds} rounds in {time.monotonic() - t0:.1f} s")
