"""A bandwidth-heavy DDP training loop that measures how much of its gradient synchronization
hides behind backward (docs/benchmarks.md, "DDP overlap"): run by `make run-topology`'s
`train --script` (or torchrun) as `--backend B --json [options]`, it prints one JSON line.

Per step it times forward + backward + the optimizer (DDP waits for every bucket before the
step). Beforehand, on the same model and batch, it times forward + backward alone (a copy
without DDP: the compute) and the all-reduces alone (every bucket's size, one after another,
synchronous: the communication). Overlap hides the smaller of the two behind the larger at best, so

    overlap share = (compute + communication - step) / min(compute, communication)

clipped to 0..1: 0 when they take turns, 1 when the smaller is wholly hidden.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--json", action="store_true", help="(always JSON; accepted for train)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="(what make run-topology's train passes; the length is --steps)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024,
                    help="the MLP's width: 4 layers of width x width (default 1024: 4.2M "
                         "parameters)")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    return ap.parse_args(argv)


def model_of(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())],
                         nn.Linear(width, 10))


def _timed(fn, times: int) -> float:
    """Median seconds of `times` calls of fn."""
    spans = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        spans.append(time.perf_counter() - t0)
    return sorted(spans)[len(spans) // 2]


def _train(model: nn.Module, a: argparse.Namespace,
           loss_of: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """Seconds per DDP step of `model` over `a.steps` steps, after `a.warmup`. DDP's reducer
    holds the process group; it is gone when this returns, so the group is torn down where
    run() destroys it, not at interpreter exit (there, with the peer's side already closed,
    gloo aborted a rank in one CI run: "terminate called without an active exception")."""
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        loss_of(ddp(x)).backward()
        opt.step()
    for _ in range(a.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    return (time.perf_counter() - t0) / a.steps


def run(a: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)
    rank = dist.get_rank()
    model = model_of(a.width)
    x = torch.randn(a.batch, a.width, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (a.batch,), generator=torch.Generator().manual_seed(rank + 1))
    loss_fn = nn.CrossEntropyLoss()

    alone = copy.deepcopy(model)

    def compute() -> None:
        alone.zero_grad()
        loss_fn(alone(x), y).backward()
    compute_s = _timed(compute, a.warmup + 3)

    params = sum(p.numel() for p in model.parameters())
    bucket = int(a.bucket_mb * 2**20 // 4)
    flats = [torch.zeros(min(bucket, params - i)) for i in range(0, params, bucket)]

    def communicate() -> None:
        for f in flats:
            dist.all_reduce(f)

    step_s = _train(model, a, lambda out: loss_fn(out, y), x)
    # After the steps, with the sessions as warm as theirs were (their speculative scales).
    communicate()
    comm_s = _timed(communicate, 5)
    hidden = compute_s + comm_s - step_s
    share = max(0.0, min(1.0, hidden / max(min(compute_s, comm_s), 1e-9)))
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    dist.barrier()  # both ranks past their last collective before either closes the group
    gc.collect()  # whatever of DDP a reference cycle kept
    dist.destroy_process_group()
    return {"rank": rank, "backend": a.backend, "overlap_env": os.environ.get("PASSING_OVERLAP"),
            "params": params, "buckets": len(flats), "steps": a.steps,
            "steps_per_s": 1 / step_s, "step_s": step_s, "compute_s": compute_s,
            "allreduce_s": comm_s, "overlap_share": share,
            "param_checksum": checksum}


def main(argv: list[str] | None = None) -> int:
    line = (json.dumps(run(parse_args(argv))) + "\n").encode()
    # One write(2) of a line under PIPE_BUF: ranks under torchrun share one stdout pipe, and
    # print()'s separate write of the newline let two ranks' reports land on one line.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
