"""A plain PyTorch DDP training script: nothing in it knows about PASSING but the backend name.

    torchrun --nnodes 2 --nproc-per-node 2 ... examples/train_ddp.py --backend gloo
    torchrun --nnodes 2 --nproc-per-node 2 ... examples/train_ddp.py --backend passing

The `passing` backend is registered when torch starts (installed with PASSING; with
TORCH_DEVICE_BACKEND_AUTOLOAD=0, `import host_agent` registers it). The job comes from the
environment (PASSING_JOB and PASSING_CONTROLLER, or PASSING_PARAMS; PASSING_HOST where the host's
addresses do not tell it): see docs/pytorch.md.

The data is synthetic and seeded (labels from a fixed random "teacher" network), so every rank
and every run sees the same problem and nothing is downloaded. With --json every rank prints, as
its last line, a JSON summary that tests and the Mininet `train` command read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, HIDDEN, CLASSES = 32, 128, 8


def make_data(seed: int, n: int) -> tuple[TensorDataset, TensorDataset]:
    """n training samples and n // 4 test samples labelled by the same teacher."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)

    def draw(count: int) -> TensorDataset:
        x = torch.randn(count, FEATURES, generator=gen)
        return TensorDataset(x, (torch.tanh(x) @ teacher).argmax(dim=1))
    return draw(n), draw(n // 4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="DDP training on a synthetic task; run it with "
                                             "torchrun")
    ap.add_argument("--backend", default="gloo",
                    help="torch.distributed backend: gloo, nccl or passing (default gloo)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda with nccl, else cpu")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true",
                    help="print a JSON summary as every rank's last line")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device_type = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(device_type, local_rank) if device_type == "cuda" else \
        torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES)).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    train, test = make_data(args.seed, args.samples)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    steps, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            steps += 1
        if rank == 0 and not args.json:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start

    with torch.no_grad():
        x, y = train.tensors
        final_loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device)).item()
        x, y = test.tensors
        accuracy = (model(x.to(device)).argmax(1).cpu() == y).float().mean().item()
        weights_sum = float(sum(p.double().sum() for p in model.parameters()))
    summary = {"ok": True, "rank": rank, "world_size": world, "backend": args.backend,
               "steps": steps, "final_loss": final_loss, "accuracy": accuracy,
               "iters_per_s": steps / elapsed if elapsed > 0 else 0.0,
               "weights_sum": weights_sum}
    # Every rank is done sending before any tears its connections down: a gloo rank whose peer
    # closed first sometimes aborted at exit ("terminate called without an active exception").
    del ddp
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(summary) if args.json else
          f"rank {rank}: loss {final_loss:.4f}, accuracy {accuracy:.3f}, "
          f"{summary['iters_per_s']:.1f} it/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
