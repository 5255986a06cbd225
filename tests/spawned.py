"""Test helper: run one worker function per rank in spawned processes and collect what each
puts on the queue, killing them whatever happens (a hung collective must not hang the suite)."""

from __future__ import annotations

import multiprocessing as mp
import queue

import pytest


def run_ranks(target, world: int, args_of, timeout: float) -> dict[int, dict]:
    """target(*args_of(rank), out) per rank; each worker puts one dict with "rank" on `out`,
    and "error" (a traceback) when it failed. Returns {rank: dict}; fails the test on errors
    or when a worker does not report within `timeout`."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(r), out)) for r in range(world)]
    results: dict[int, dict] = {}
    try:
        for p in procs:
            p.start()
        for _ in range(world):
            r = out.get(timeout=timeout)
            results[r["rank"]] = r
    except queue.Empty:
        pytest.fail(f"workers did not finish; got ranks {sorted(results)}")
    finally:
        for p in procs:
            if p.pid is None:
                continue
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [r["error"] for r in results.values() if "error" in r]
    assert not errors, errors[0]
    return results
