"""A tensor to and from the float64 numpy values the streamers and the host collective sum: the
switch's sum of a tensor, the sum rounded once into a tensor of any dtype and device, and the
host collective's sum over a process group."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from host_agent.host_collective import HostsSum
from host_agent.stream import SlotStreamer


def switch_sum(streamer: SlotStreamer, tensor: torch.Tensor) -> torch.Tensor:
    """The sum of `tensor` over the job's streams, through the switch, as a float64 CPU tensor
    of its shape: the streamer works on float64 numpy values on the CPU."""
    total = streamer.allreduce(tensor.detach().to("cpu", torch.float64).numpy())
    return torch.from_numpy(np.asarray(total).reshape(tensor.shape))


def stream_tensor(streamer: SlotStreamer, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed through the switch by `streamer`, in place (on its own device and
    dtype)."""
    return tensor.copy_(switch_sum(streamer, tensor))


def round_into(out: torch.Tensor, sums: np.ndarray, divide_by: int) -> None:
    """`sums` (float64, one per element of the contiguous `out`; may be changed) divided by
    `divide_by` and rounded once to out's dtype, into `out`: straight from numpy where out is
    a float32 or float64 CPU tensor, through a CPU tensor otherwise (another device, half
    precision)."""
    if out.device.type == "cpu" and out.dtype in (torch.float32, torch.float64):
        dst = out.numpy().reshape(-1)
        with np.errstate(over="ignore"):  # beyond float32: inf, as torch's copy gives
            if divide_by != 1:
                np.divide(sums, divide_by, out=dst, casting="same_kind")
            else:
                np.copyto(dst, sums, casting="same_kind")
        return
    if divide_by != 1:
        np.divide(sums, divide_by, out=sums)
    out.copy_(torch.from_numpy(sums).reshape(out.shape))


def hosts_sum_over(group: dist.ProcessGroup | None) -> HostsSum | None:
    """The host collective's sum over `group` (the hosts' leaders): float64 on the CPU, in
    place."""
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return None

    def hosts_sum(values: np.ndarray) -> None:
        group.allreduce([torch.from_numpy(values)]).wait()
    return hosts_sum
