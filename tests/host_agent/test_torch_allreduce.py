"""G local ranks on each of H servers, real processes with torch.distributed (gloo) for the local
stage and real UDP to the switch pipeline: allreduce equals the sum over all ranks, and a DDP
model trained with the PASSING hook ends where DDP's own all-reduce ends."""

from __future__ import annotations

import multiprocessing as mp
import socket
import traceback

import numpy as np
import pytest

from passing.contract import JobParams
from testbed.loopback import UdpLoopbackSwitch
from tests.ports import free_port
from tests.spawned import run_ranks

HOSTS, LOCAL = 2, 2
WORLD = HOSTS * LOCAL



def worker(rank: int, port: int, params: JobParams, out: mp.Queue) -> None:
    try:
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        from host_agent.allreduce import AllreduceError, PassingAllreduce, passing_hook

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        groups = [dist.new_group(list(range(h * LOCAL, (h + 1) * LOCAL))) for h in range(HOSTS)]
        host = rank // LOCAL
        passing = PassingAllreduce(params, f"h{host + 1}", groups[host], rto=0.05)

        # Plain allreduce of a tensor whose length is not a multiple of K.
        t = torch.arange(1000, dtype=torch.float32) * (rank + 1) - 7.5
        passing.allreduce(t)
        result = {"rank": rank, "allreduce": t.numpy().copy(),
                  # CPU ranks of a gloo group on one machine: the local stage went through
                  # shared memory (host_agent.local_stage)
                  "shared_stage": passing._stage is not None and passing._stage.shared}

        # Half precision is summed in fixed point and comes back in its own dtype.
        for dtype in (torch.float16, torch.bfloat16):
            h = torch.full((100,), 0.5 * (rank + 1), dtype=dtype)
            passing.allreduce(h)
            result[str(dtype)] = (h.dtype == dtype, h.float().numpy().copy())

        # NaN on one rank: every rank gets a clear error, nobody hangs.
        bad = torch.ones(10)
        if rank == 3:
            bad[4] = float("nan")
        try:
            passing.allreduce(bad)
            result["nan"] = "no error"
        except AllreduceError as e:
            result["nan"] = str(e)

        def train(hook: bool) -> list[np.ndarray]:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            ddp = DDP(model)
            if hook:
                ddp.register_comm_hook((passing, WORLD), passing_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(100 + rank)
            for _ in range(5):
                x = torch.randn(8, 16, generator=gen)
                y = torch.randint(0, 4, (8,), generator=gen)
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
            return [p.detach().numpy().copy() for p in model.parameters()]

        result["ddp_default"] = train(hook=False)
        result["ddp_passing"] = train(hook=True)
        out.put(result)
        dist.destroy_process_group()
    except Exception:
        out.put({"rank": rank, "error": traceback.format_exc()})


@pytest.fixture
def switch():
    sw = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=16)
    yield sw
    sw.close()


def test_local_ranks_allreduce_and_train_with_the_ddp_hook(switch):
    port = free_port()
    params = switch.agent_params()
    results = run_ranks(worker, WORLD, lambda r: (r, port, params), timeout=180)

    expected = sum(np.arange(1000, dtype=np.float64) * (r + 1) - 7.5 for r in range(WORLD))
    for r in range(WORLD):
        assert np.allclose(results[r]["allreduce"], expected, rtol=0, atol=1e-3)
        assert results[r]["shared_stage"]
        assert "NaN/Inf" in results[r]["nan"] or "NaN or Inf" in results[r]["nan"]
        for dtype in ("torch.float16", "torch.bfloat16"):
            same_dtype, values = results[r][dtype]
            assert same_dtype and np.all(values == 0.5 * (1 + 2 + 3 + 4))
        for a, b in zip(results[r]["ddp_default"], results[r]["ddp_passing"], strict=True):
            assert np.max(np.abs(a - b)) < 1e-5
    # Every rank holds the same weights after training, and they moved from the init.
    assert all(np.array_equal(results[0]["ddp_passing"][0], results[r]["ddp_passing"][0])
               for r in range(WORLD))


def test_a_wrong_host_or_mode_is_refused_before_any_collective():
    """Both fail in the constructor, on every rank, without a process group: a leader built
    for the wrong host or an ina job would otherwise wait on the switch until its deadline."""
    from host_agent.allreduce import PassingAllreduce

    passing = UdpLoopbackSwitch(2, agent_udp_port=free_port(socket.SOCK_DGRAM))
    ina = UdpLoopbackSwitch(2, agent_udp_port=free_port(socket.SOCK_DGRAM), ranks=2)
    try:
        with pytest.raises(ValueError, match=r"host h9 is not in job 1 \(hosts: h1, h2\)"):
            PassingAllreduce(passing.agent_params(), "h9")
        with pytest.raises(ValueError, match="job 1 is an ina job; PassingAllreduce needs a "
                                             "job created in mode passing"):
            PassingAllreduce(ina.agent_params(), "h1")
    finally:
        passing.close()
        ina.close()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("divide_by", [1, 3])
def test_the_leader_rounds_the_float64_sums_into_the_tensor_once(dtype, divide_by):
    """The leader writes the switch's float64 sums into the caller's tensor, divided (AVG)
    before the one rounding to its dtype, as torch would round the float64 quotient: a
    division after rounding to float32 would round twice, and a sum beyond the dtype's range
    whose average fits must not become inf."""
    import torch

    from host_agent.tensor_sums import round_into as _round_into

    rng = np.random.default_rng(7)
    sums = rng.normal(0, 1e4, 4099) + rng.normal(0, 1e-3, 4099)
    sums[:2] = (16777217.0, 2.0 ** 129)  # not a float32; beyond float32, its third is not
    torch_dtype = getattr(torch, dtype)
    want = (torch.from_numpy(sums.copy()) / divide_by).to(torch_dtype)
    out = torch.full((4099,), 5.0, dtype=torch_dtype)
    _round_into(out, sums.copy(), divide_by)
    assert torch.equal(out, want)
    if dtype == "float32" and divide_by != 1:
        twice = torch.from_numpy(sums).to(torch_dtype) / divide_by
        assert not torch.equal(out, twice), "these values do not tell one rounding from two"
