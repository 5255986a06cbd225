"""Training with a straggler: the digits MLP (passing_agent/training.py), one all-reduce per step,
the compute of each step emulated, one node's made slower. Run by torchrun on every host
(bench/stragglers.py drives it in Mininet); every rank prints a JSON report as its last line.

Why emulated compute: the MLP's own forward and backward take about a millisecond, so "2x
slower" would change nothing measurable. Each step therefore lasts at least --compute-ms
(the real work, then a sleep for the rest), and --slow-factor times that on --slow-node's
ranks: a host whose GPUs are that much slower.

With --catch-up (and the `passing` backend in quorum mode, PASSING_PATIENCE), a rank asks how
many steps the other hosts completed without its host (host_agent.backend.calls_behind): at
the start of a step, and, once its step has lasted longer than a normal node's, between
chunks of its compute. Steps already complete are not
computed (or no further): an all-reduce of zeros returns the mean the others stepped with, at
once, as a backup worker in synchronous SGD drops its stale gradient and starts at the
current step. Every replica stays the same (the report's `param_checksum` says so).

Accuracy is measured every --eval-every steps by every rank on its own replica, the clock
stopped, so `curve` is (training seconds, step, test accuracy) without the evaluations' cost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn

from passing_agent.training import (
    batch_indices,
    load_digits_split,
    model_and_buffer,
    set_flat_grads,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="digits MLP training with an emulated straggler; "
                                             "run it with torchrun")
    ap.add_argument("--backend", default="passing")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--compute-ms", type=float, default=100.0,
                    help="the least time a step's compute takes on a normal node")
    ap.add_argument("--slow-node", type=int, default=-1,
                    help="node (torchrun GROUP_RANK) whose ranks are slower; -1: none")
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--slow-period", type=int, default=0,
                    help="a straggler whose slowness varies: slow for this many steps, then "
                         "normal for as many, and so on (default 0: slow throughout)")
    ap.add_argument("--catch-up", action="store_true",
                    help="skip computing the steps the other hosts completed without this one")
    ap.add_argument("--check-ms", type=float, default=10.0,
                    help="with --catch-up: past a normal step's compute, ask this often "
                         "whether the step is already complete (default 10)")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1 or args.compute_ms < 0 or args.slow_factor < 1 \
            or args.check_ms <= 0 or args.slow_period < 0:
        ap.error("--steps and --eval-every at least 1, --compute-ms at least 0, "
                 "--slow-factor at least 1, --check-ms above 0, --slow-period at least 0")
    return args


def behind(numel: int) -> int:
    from host_agent.backend import calls_behind  # the passing backend's; 0 under any other
    return calls_behind(numel)


def compute(began: float, seconds: float, args: argparse.Namespace, numel: int) -> bool:
    """The rest of the step's emulated compute, until `seconds` after `began`. With
    --catch-up, a rank still computing when a normal node's step (--compute-ms) is over asks
    every --check-ms whether the other hosts already completed this step without its host
    (as a real worker could between micro-batches or layers, once it sees it is slow); True
    if so: the rest is abandoned. A node at normal speed never asks. Every local rank of a
    node computes as long, so all make the same checks (each is a broadcast in the host)."""
    normal = args.compute_ms / 1e3
    if not args.catch_up or seconds <= normal:
        _sleep_until(began + seconds)
        return False
    chunk = args.check_ms / 1e3
    checks = max(1, round((seconds - normal) / chunk))
    for i in range(checks):
        _sleep_until(began + normal + i * chunk)
        if behind(numel):
            return True
    _sleep_until(began + seconds)
    return False


def _sleep_until(t: float) -> None:
    rest = t - time.perf_counter()
    if rest > 0:
        time.sleep(rest)


def leader_stats() -> dict:
    """The host leader's stream counters (quorum mode, over the whole run), the pools it
    streamed in (live resizing: [call, pool, window] of every move) and the policies it took
    (live `job set`: [call, policy number] of every change, and the staleness bound at the
    end), for the report; {} elsewhere."""
    passing = getattr(dist.group.WORLD, "passing", None)
    stream = getattr(passing, "stream", None)
    if stream is None:
        return {}
    streamer = stream.streamer
    st = streamer.stats
    return {"short_calls": st.short_calls, "closes": st.closes, "taken_early": st.taken_early,
            "packets": st.packets, "retransmissions": st.retransmissions,
            "fast_retransmissions": st.fast_retransmissions, "probes": st.probes,
            "rotated": st.rotated,
            "patience_end": streamer.patience_now(), "round_wait": streamer.wait_avg,
            "pool_moves": [list(m) for m in stream.vote.moves],
            "policy_changes": [list(m) for m in stream.vote.policies],
            "staleness_end": streamer.cfg.staleness, "window": streamer.cfg.window}


def run(args: argparse.Namespace) -> dict:
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ.get("GROUP_RANK", "0"))
    if args.global_batch % world:
        raise ValueError(f"--global-batch {args.global_batch} is not divisible by {world} "
                         "ranks")
    shard = args.global_batch // world

    def compute_s(step: int) -> float:
        slow = node == args.slow_node and (not args.slow_period
                                           or (step // args.slow_period) % 2 == 0)
        return args.compute_ms / 1e3 * (args.slow_factor if slow else 1.0)

    x_train, y_train, x_test, y_test = load_digits_split(args.seed)
    x_train_t, y_train_t = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test_t = torch.from_numpy(x_test)
    batches = torch.from_numpy(batch_indices(len(x_train), args.steps, args.global_batch,
                                             args.seed)[:, rank * shard:(rank + 1) * shard])
    model, params, n_grad, flat = model_and_buffer(args.seed)
    loss_fn = nn.CrossEntropyLoss()

    def step_with(mean: torch.Tensor) -> None:
        set_flat_grads(model, mean[:n_grad])
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-args.lr)

    def accuracy() -> float:
        with torch.no_grad():
            return float((model(x_test_t).argmax(dim=1).numpy() == y_test).mean())

    curve: list[tuple[float, int, float]] = [(0.0, 0, accuracy())]
    skipped, losses = 0, []
    trained = 0.0  # seconds of the step loop, evaluations left out
    s = 0
    while s < args.steps:
        began = time.perf_counter()
        ahead = min(behind(flat.numel()), args.steps - s) if args.catch_up else 0
        for _ in range(ahead):  # the others' results, taken without computing
            flat.zero_()
            dist.all_reduce(flat, op=dist.ReduceOp.AVG)
            step_with(flat)
            losses.append(float(flat[n_grad]))
            skipped += 1
            s += 1
        if s < args.steps:
            idx = batches[s]
            for p in params:
                p.grad.zero_()
            loss = loss_fn(model(x_train_t[idx]), y_train_t[idx])
            loss.backward()
            abandoned = compute(began, compute_s(s), args, flat.numel())
            if abandoned:  # the others completed this step: its gradient would be dropped
                flat.zero_()
                skipped += 1
            else:
                torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)],
                          out=flat)
            dist.all_reduce(flat, op=dist.ReduceOp.AVG)
            step_with(flat)
            losses.append(float(flat[n_grad]))
            s += 1
        trained += time.perf_counter() - began
        if s % args.eval_every == 0 or s == args.steps or ahead:
            curve.append((trained, s, accuracy()))
    final = accuracy()
    stats = leader_stats()
    checksum = float(sum(p.detach().double().abs().sum() for p in params))
    dist.destroy_process_group()
    return {"ok": True, "rank": rank, "node": node, "world_size": world,
            "backend": args.backend, "steps": args.steps, "seconds": trained,
            "iters_per_s": args.steps / trained if trained > 0 else 0.0,
            "skipped": skipped, "accuracy": final, "final_loss": losses[-1],
            "param_checksum": checksum, "curve": curve, **stats}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except Exception as e:
        traceback.print_exc()
        report = {"ok": False, "error": f"{type(e).__name__}: {e}",
                  "rank": int(os.environ.get("RANK", "-1"))}
    print(json.dumps(report) if args.json else report, flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
