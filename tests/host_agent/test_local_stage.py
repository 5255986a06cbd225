"""The shared-memory local stage (host_agent/local_stage.py) with real processes in a gloo
group: every call's sum and result right on every rank, through mappings that grow, the
status over the ranks' channel (host_agent/local_channel.py); ranks that do not share the
memory fall back to gloo, never summing without a rank; ranks that call with different sizes
fail together, whether the group or the channel finds it; a rank that exits makes the others
fail, not hang; no file is left behind."""

from __future__ import annotations

import os
import select
import traceback
from pathlib import Path

import numpy as np
import pytest

from tests.ports import free_port
from tests.spawned import run_ranks

RANKS = 3
# numel, result dtype per call: the mapping grows at the first, second and fourth
SIZES = [(10, "float32"), (1000, "float16"), (5, "float64"), (50_000, "bfloat16"),
         (7, "float32")]


# scenario: how rank 2 departs from the others, and at which call (index into SIZES)
SCENARIOS = {
    "mismatch-first": (0, 1),  # one element more in the first call (the group finds it)
    "mismatch-later": (2, 1),  # ... in the third (5 elements: it fits, the channel finds it)
    "mismatch-grow": (2, 1995),  # ... a size that needs a larger mapping on rank 2 alone
    "exit": (2, None),  # rank 2 exits before its third call
    "exit-after-ready": (2, None),  # ... in its third call, after telling the leader READY
}


def worker(rank: int, port: int, shm_dir: str, scenario: str, out) -> None:
    try:
        import errno

        import torch
        import torch.distributed as dist

        from host_agent import local_stage
        from host_agent.local_channel import ChannelBroken
        from host_agent.local_stage import LocalStageMismatch, SharedLocalStage

        if shm_dir.endswith("{nospace}"):  # rank 1's /dev/shm is full
            shm_dir = shm_dir[:-len("{nospace}")]
            if rank == 1:
                def full(fd, offset, length):
                    raise OSError(errno.ENOSPC, "No space left on device")
                local_stage.os.posix_fallocate = full
        os.environ["PASSING_SHM_DIR"] = shm_dir.format(rank=rank)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=RANKS)
        stage = SharedLocalStage(dist.group.WORLD, rank, RANKS, "passing-test-stage")
        calls, channel = [], []
        at, more = SCENARIOS.get(scenario, (None, None))
        for i, (n, dtype) in enumerate(SIZES):
            if rank == 2 and i == at:
                if more is None and scenario == "exit-after-ready":
                    stage.put(torch.arange(n, dtype=torch.float32) * 3 + 0.25,
                              getattr(torch, dtype))
                    assert stage.agree()  # READY sent; the status it does not wait for
                if more is None:  # said first, as run_ranks waits for every rank's word
                    out.put({"rank": rank, "exited": True})
                    out.close()
                    out.join_thread()
                    os._exit(0)
                n += more
            local = torch.arange(n, dtype=torch.float32) * (rank + 1) + 0.25
            result = torch.zeros(n, dtype=getattr(torch, dtype))
            shared = stage.shared  # as PassingAllreduce: gloo once the stage is given up
            if shared:
                stage.put(local, result.dtype)
                try:
                    shared = stage.agree()
                except (LocalStageMismatch, ChannelBroken) as e:
                    broken = isinstance(e, ChannelBroken)
                    calls.append(("broken" if broken else "mismatch", str(e)))
                    if broken:
                        break
                    continue
            if not shared:  # what PassingAllreduce does then: gloo for this call
                dist.reduce(local, 0)
            elif rank == 0:
                stage.gather(local)
            if rank == 0:
                result.copy_(local * 2)
                if shared:
                    stage.publish(result)
            # The status, as PassingAllreduce sends it: the result is there after it.
            channel.append(len(stage.links))
            if rank == 0 and scenario == "exit-after-ready" and i == at:
                # The status goes out once rank 2's end is closed (it reads as ready).
                assert select.select([stage.links[2].sock], [], [], 30)[0]
            if stage.links:
                try:
                    code, _, message = stage.share_status(0, 0, "")
                except ChannelBroken as e:
                    calls.append(("broken", str(e)))
                    break
                if code:
                    calls.append(("status", message))
                    continue
            else:
                dist.barrier()
            if not shared:
                dist.broadcast(result, 0)
            elif rank != 0:
                stage.take(result)
            calls.append((shared, local.numpy().copy() if rank == 0 else None,
                          result.float().numpy().copy()))
        stage.close()
        out.put({"rank": rank, "calls": calls, "gen": stage.gen, "channel": channel})
        if scenario != "exit":
            dist.destroy_process_group()
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


def run(shm_dir: str, scenario: str = "", ranks: int = RANKS) -> dict[int, dict]:
    port = free_port()
    return run_ranks(worker, ranks, lambda r: (r, port, shm_dir, scenario), timeout=120)


def expected(n: int) -> np.ndarray:
    return sum(np.arange(n, dtype=np.float32) * (r + 1) + 0.25 for r in range(RANKS))


def test_every_call_sums_every_rank_and_hands_back_the_result(tmp_path: Path):
    import torch

    results = run(str(tmp_path))
    for r in range(RANKS):
        calls = results[r]["calls"]
        assert len(calls) == len(SIZES)
        for (n, dtype), (shared, local, result) in zip(SIZES, calls, strict=True):
            assert shared
            want = (expected(n) * 2).astype(np.float32)
            if r == 0:
                assert np.array_equal(local, expected(n))
            rounded = torch.from_numpy(want).to(getattr(torch, dtype)).float().numpy()
            assert np.array_equal(result, rounded), (r, n, dtype)
        assert results[r]["gen"] == 3  # grown three times, alike on every rank
        # The status of every call went over the channel, made in the first call.
        assert results[r]["channel"] == [RANKS - 1 if r == 0 else 1] * len(SIZES)
    # every mapping's name and the channel's socket removed once all had them
    assert list(tmp_path.iterdir()) == []


def test_a_directory_with_no_room_for_a_socket_name_keeps_the_group_for_the_status(tmp_path):
    """A socket's name is at most 107 bytes: in a deeper directory the channel cannot be
    made, on any rank, and every call goes on with the shared memory and the group's
    collectives, every sum right."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    results = run(str(deep))
    for r in range(RANKS):
        calls = results[r]["calls"]
        assert [c[0] for c in calls] == [True] * len(SIZES)
        for (n, _), (_, _, result) in zip(SIZES, calls, strict=True):
            assert np.allclose(result, expected(n) * 2, rtol=1e-2)
        assert results[r]["channel"] == [0] * len(SIZES)
    assert list(deep.iterdir()) == []


@pytest.mark.parametrize("dirs", ["separate", "missing", "full"])
def test_ranks_that_do_not_share_the_memory_fall_back_to_gloo_in_the_same_call(dirs, tmp_path):
    """Each rank's own directory plays ranks on different machines: the first call finds the
    tokens do not add up on every rank, goes through gloo, and so does every later one; every
    sum holds every rank's data. So does a directory that is not there (no /dev/shm), or one
    with no room for the mapping (its pages are reserved when it is made, so that is an error
    then, not a SIGBUS at the first write): the rank that cannot map says so in the same
    collective."""
    if dirs == "full":
        results = run(str(tmp_path) + "{nospace}")
        for r in range(RANKS):
            assert [c[0] for c in results[r]["calls"]] == [False] * len(SIZES)
        assert list(tmp_path.iterdir()) == []
        return
    for r in range(RANKS):
        if dirs == "separate" or r == 1:
            (tmp_path / str(r)).mkdir()
    results = run(str(tmp_path / "{rank}"))
    for r in range(RANKS):
        calls = results[r]["calls"]
        assert [c[0] for c in calls] == [False] * len(SIZES)
        for (n, _), (_, local, result) in zip(SIZES, calls, strict=True):
            if r == 0:
                assert np.array_equal(local, expected(n))
            assert np.allclose(result, expected(n) * 2, rtol=1e-2)
        assert results[r]["gen"] == 1  # no mapping tried after the first
    assert [list(p.iterdir()) for p in tmp_path.iterdir()] == \
        [[]] * (RANKS if dirs == "separate" else 1)


def test_empty_tensors_and_other_devices_keep_gloo():
    """An empty tensor has nothing to map (gloo takes it as it always did); neither do
    dtypes the stage does not carry, nor a single rank."""
    import torch

    from host_agent.local_stage import usable

    assert not usable(None, 2, torch.zeros(0))
    assert not usable(None, 2, torch.zeros(4, dtype=torch.int64))
    assert not usable(None, 1, torch.zeros(4))


@pytest.mark.parametrize("scenario", ["mismatch-first", "mismatch-later", "mismatch-grow"])
def test_ranks_calling_with_different_sizes_all_fail_with_a_clear_error(scenario, tmp_path):
    """Found by the group's all-reduce in the first call; later by the leader over the
    channel, which tells a rank waiting for the status in the status and one waiting for a
    verdict (rank 2, when it needed a larger mapping) in a verdict. Every call before is
    right on every rank; so is every call after, through gloo: after a mismatch the ranks'
    mappings may differ in size and generation (rank 2 grew alone), and one used again could
    put the result where another rank does not read it. No file is left."""
    results = run(str(tmp_path), scenario)
    at = SCENARIOS[scenario][0]
    for r in range(RANKS):
        calls = results[r]["calls"]
        assert len(calls) == len(SIZES), (r, calls)
        for i, ((n, _), call) in enumerate(zip(SIZES, calls, strict=True)):
            if i == at:
                kind, message = call
                waits_for_status = at and r > 0 and not (r == 2 and scenario == "mismatch-grow")
                assert kind == ("status" if waits_for_status else "mismatch"), (r, kind)
                assert "different sizes or dtypes" in message
                continue
            shared, _, result = call
            assert shared == (i < at), (r, i)
            assert np.allclose(result, expected(n) * 2, rtol=1e-2), (r, i)
        after = len(SIZES) - at - 1  # calls after the mismatch: no channel, gloo's status
        assert results[r]["channel"][len(results[r]["channel"]) - after:] == [0] * after
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_exits_makes_the_others_fail_not_hang(tmp_path):
    """Rank 2 exits after two calls: the leader finds its end closed when it waits for its
    READY and says so to rank 1, which was waiting for the status; both raise."""
    results = run(str(tmp_path), "exit")
    assert results[2] == {"rank": 2, "exited": True}
    for r in (0, 1):
        calls = results[r]["calls"]
        assert len(calls) == 3
        for (n, _), (shared, _, result) in zip(SIZES, calls[:2], strict=False):
            assert shared and np.allclose(result, expected(n) * 2, rtol=1e-2)
        assert calls[2][0] == "broken"
        assert "local rank 2" in calls[2][1]


def test_a_rank_that_exits_while_the_leader_sums_fails_nobody_until_the_next_call(tmp_path):
    """Rank 2 tells the leader READY in its third call, then exits before the status: the
    leader finds its end closed as it sends an OK status, which rank 1 has by then. Both keep
    that call's right result (a status that failed the leader alone would leave the ranks of
    one host out of step), and both fail the next call, naming rank 2."""
    results = run(str(tmp_path), "exit-after-ready")
    assert results[2] == {"rank": 2, "exited": True}
    for r in (0, 1):
        calls = results[r]["calls"]
        assert len(calls) == 4, calls
        for (n, _), (shared, _, result) in zip(SIZES, calls[:3], strict=False):
            assert shared and np.allclose(result, expected(n) * 2, rtol=1e-2)
        assert calls[3][0] == "broken"
        assert "local rank 2" in calls[3][1]


def choice_worker(rank: int, port: int, refusing: list[int], out) -> None:
    try:
        import torch.distributed as dist

        from host_agent import local_stage

        if rank in refusing:
            os.environ[local_stage.STAGE_ENV] = "gloo"
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=RANKS)
        out.put({"rank": rank, "allowed": local_stage.allowed(dist.group.WORLD, RANKS)})
        dist.destroy_process_group()
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


@pytest.mark.parametrize("refusing", [[], [1], [0, 2]])
def test_the_ranks_agree_on_whether_shared_memory_may_be_used(refusing):
    """PASSING_LOCAL_STAGE is each process's own: one rank with =gloo turns the shared stage
    off for all (ranks that chose differently would meet in different collectives)."""
    port = free_port()
    results = run_ranks(choice_worker, RANKS, lambda r: (r, port, refusing), timeout=120)
    assert [results[r]["allowed"] for r in range(RANKS)] == [not refusing] * RANKS
