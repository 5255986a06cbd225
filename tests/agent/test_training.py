"""The training workload learns, and data parallelism over real gloo processes ends where one
process on the same global batches ends, so that it can judge whether an all-reduce strategy
aggregated correctly."""

from __future__ import annotations

import math
import multiprocessing as mp
import socket
import traceback

import numpy as np
import pytest
import torch

from passing_agent.training import load_digits_split, make_model, train
from tests.spawned import run_ranks

WORLD, STEPS, SEED, GLOBAL_BATCH = 2, 30, 3, 64


def identity(t: torch.Tensor) -> torch.Tensor:
    return t


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, port: int, out: mp.Queue) -> None:
    try:
        import torch
        import torch.distributed as dist

        from passing_agent.training import train

        torch.set_num_threads(1)  # two processes on as few as two cores
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        try:
            res = train(lambda t: (dist.all_reduce(t), t)[1], rank, WORLD, STEPS, seed=SEED,
                        global_batch=GLOBAL_BATCH)
        finally:
            dist.destroy_process_group()
        out.put({"rank": rank, "result": res})
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


def test_single_process_training_learns_the_digits():
    res = train(identity, 0, 1, 300, seed=0)
    # Reaches 0.94 (0.93-0.96 over seeds 0-3); untrained weights sit near chance (0.1).
    assert res["accuracy"] > 0.9
    assert res["final_loss"] < 0.5
    assert res["steps"] == 300 and res["seconds"] > 0 and res["iters_per_s"] > 0

    frozen = train(identity, 0, 1, 300, seed=0, lr=0.0)
    assert frozen["accuracy"] < 0.3
    assert frozen["param_checksum"] != res["param_checksum"]


def test_allreduce_sees_one_float32_tensor_per_step():
    seen = []

    def spy(t: torch.Tensor) -> torch.Tensor:
        seen.append((t.dtype, t.numel(), t.is_contiguous()))
        return t

    res = train(spy, 0, 1, 5)
    n_params = sum(p.numel() for p in make_model(0).parameters())
    assert seen == [(torch.float32, n_params + 1, True)] * 5
    assert res["allreduce_numel"] == n_params + 1


def test_two_gloo_ranks_match_one_process_on_the_global_batch():
    port = free_port()
    results = run_ranks(worker, WORLD, lambda r: (r, port), timeout=120)

    single = train(identity, 0, 1, STEPS, seed=SEED, global_batch=GLOBAL_BATCH)
    ranks = [results[r]["result"] for r in range(WORLD)]
    # Every rank applied the same averaged gradient, so they hold identical weights.
    assert all(r["param_checksum"] == ranks[0]["param_checksum"] for r in ranks)
    assert all(r["accuracy"] == ranks[0]["accuracy"] for r in ranks)
    for r in ranks:
        assert math.isclose(r["param_checksum"], single["param_checksum"], rel_tol=1e-4)
        assert math.isclose(r["accuracy"], single["accuracy"], rel_tol=1e-4)
        assert math.isclose(r["final_loss"], single["final_loss"], rel_tol=1e-4)
    # ...and training moved them from the init.
    init = float(sum(p.detach().double().abs().sum() for p in make_model(SEED).parameters()))
    assert not math.isclose(single["param_checksum"], init, rel_tol=1e-3)


def test_global_batch_must_split_evenly_over_the_world():
    with pytest.raises(ValueError, match=r"64.*\b3\b"):
        train(identity, 0, 3, 1, global_batch=64)


def test_digits_split_is_deterministic_disjoint_and_complete():
    a, b = load_digits_split(0), load_digits_split(0)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    x_train, y_train, x_test, y_test = a
    assert len(x_train) + len(x_test) == 1797 and len(y_train) == len(x_train)
    assert len(y_test) == len(x_test) and abs(len(x_test) - 0.25 * 1797) <= 1
    assert x_train.dtype == np.float32 and x_train.min() >= 0 and x_train.max() <= 1
    # No test image is a training image (the digits hold no exact duplicates across the split).
    train_rows = {row.tobytes() for row in x_train}
    assert not any(row.tobytes() in train_rows for row in x_test)
    # Stratified: every class is in both halves.
    assert set(y_train) == set(y_test) == set(range(10))
    assert not np.array_equal(load_digits_split(1)[2], x_test)


def test_model_init_depends_on_the_seed_only_and_spares_the_global_rng():
    state = torch.random.get_rng_state()
    a, b, c = make_model(5), make_model(5), make_model(6)
    assert torch.equal(torch.random.get_rng_state(), state)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_the_wide_workload_has_a_million_parameters_and_learns():
    from passing_agent.workloads import parameters

    n = sum(p.numel() for p in make_model(0, "digits-wide").parameters())
    assert n == parameters("digits-wide") == 1_126_410
    assert sum(p.numel() for p in make_model(0).parameters()) == parameters("digits-mlp")
    seen = []

    def spy(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.numel())
        return t

    res = train(spy, 0, 1, 120, seed=0, model="digits-wide", eval_every=40)
    assert seen == [n + 1] * 120  # the whole gradient (and the loss) in every step's call
    assert res["model"] == "digits-wide" and res["accuracy"] > 0.9
    # Accuracy before the first step, every 40 steps and at the end, on training time.
    assert [s for _, s, _ in res["curve"]] == [0, 40, 80, 120]
    times = [t for t, _, _ in res["curve"]]
    assert times[0] == 0 and times == sorted(times) and times[-1] <= res["seconds"] + 1e-6
    assert res["curve"][0][2] < 0.3 and res["curve"][-1][2] == res["accuracy"]
    with pytest.raises(ValueError, match="no model"):
        make_model(0, "digits-huge")


def test_a_curve_does_not_change_what_is_learned():
    plain = train(identity, 0, 1, 30, seed=1)
    curved = train(identity, 0, 1, 30, seed=1, eval_every=7)
    assert plain["param_checksum"] == curved["param_checksum"]
    assert plain["curve"] == [] and [s for _, s, _ in curved["curve"]] == [0, 7, 14, 21, 28, 30]


def test_the_clock_starts_after_every_rank_is_ready():
    """`ready` (the benchmark's start line) is called once, before the first all-reduce, and
    its wait is not training time: a rank that waited 1.5 s for the others to load reports
    the same run as one that did not wait."""
    import time

    events = []

    def ready():
        events.append("ready")
        time.sleep(1.5)

    def allreduce(t):
        events.append("allreduce")
        return t

    res = train(allreduce, 0, 1, steps=3, ready=ready)
    assert events == ["ready", "allreduce", "allreduce", "allreduce"]
    assert res["seconds"] < 1.5
