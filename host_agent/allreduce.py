"""PASSING all-reduce for the ranks of one server: in-host pre-aggregation, then the switch.

The G local ranks of a server share a torch.distributed process group (gloo on CPU, NCCL on
CUDA). `allreduce(tensor)`, called by every local rank:

1. reduces the G local tensors onto the leader (local rank 0) with the local group;
2. the leader streams the server's sum through the switch (host_agent.stream) and gets the sum
   over all servers;
3. the leader broadcasts the result to the local ranks.

A failure on the leader (switch timeout, NaN/Inf) is broadcast as a status first, with its
message, so that every local rank raises the leader's error instead of waiting forever for a
tensor that will not come.

The tensor is changed in place as gloo and NCCL change it: outside autograd (a loss summed
across ranks keeps its graph; a parameter may be summed), whatever its layout (a strided view
is summed through a contiguous copy), rounded once from the switch's float64 result to its own
dtype, after an optional division (AVG divides before rounding, so a float16 average of large
values does not overflow where the sum would).
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as objects.
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from host_agent import local_stage
from host_agent.fixed_point import NonFiniteError
from host_agent.local_channel import ChannelBroken
from host_agent.pool_move import Policy
from host_agent.pooled_stream import PooledStreamer
from host_agent.session import job_session
from host_agent.stream import SlotStreamer
from host_agent.stream_api import SessionBroken, StreamConfig, SwitchTimeout, Transport
from host_agent.tensor_sums import hosts_sum_over, round_into
from host_agent.transport import UdpTransport
from passing.contract import JobParams

_OK, _NONFINITE, _TIMEOUT, _OTHER = 0, 1, 2, 3
_MESSAGES = {_NONFINITE: "NaN or Inf in the gradients", _TIMEOUT: "the switch did not answer",
             _OTHER: "the leader failed"}
# The status code, whether the next calls may close rounds without everyone (a live policy
# change reaches the other local ranks so), then the leader's message (utf-8, cut to fit).
_STATUS_BYTES = 512
# PassingAllreduce objects made in this process per (session, job, host): the local ranks make
# theirs in the same order, so the n-th one's shared memory has the same name on each.
_STAGES_MADE: dict[tuple[int, int, str], int] = {}
NONFINITE_POLICIES = ("raise", "propagate")


class AllreduceError(RuntimeError):
    """The all-reduce could not be completed; raised on every local rank."""


class PassingAllreduce:
    def __init__(self, params: JobParams, host: str, group: dist.ProcessGroup | None = None,
                 transport: Transport | None = None, *, session: int | None = None,
                 nonfinite: str = "raise",
                 params_source: Callable[[], JobParams] | None = None, poll: float = 2.0,
                 policy: Policy | None = None, udp_segments: int | None = None,
                 hosts_group: dist.ProcessGroup | None = None, **stream_options):
        """params: the job's agent parameters (JobParams.load of passing-ctl's --params-out, or
        JobParams.from_dict of 'agent_params' in passing-ctl job show --json);
        host: this server's name in them; group: the local ranks (default: the whole world,
        i.e. one server); session: the run's session number, the same on every host
        (host_agent.session); by default it is agreed over the default process group, which
        then must span every host of the job, and every rank of it constructs this together;
        nonfinite: with NaN or Inf on any rank, "raise" AllreduceError on every rank, or
        "propagate": the result is NaN everywhere, as a sum with NaN in it is (what
        torch.amp.GradScaler needs to skip the step). `stream_options` (StreamConfig's:
        patience, staleness, ...) must be the same on every local rank: only the leader
        streams, but every rank takes part in calls_behind when patience is set;
        params_source: where the leader polls the job's parameters every `poll` seconds, to
        learn of a live resize (`passing-ctl job resize`; host_agent.pool_move): e.g.
        `lambda: host_agent.job_source.params_from_env()`. Without one, the pool stays the one
        in `params`; policy: the patience and staleness bound (StreamConfig's fields) to use
        under newer parameters polled there (a live `passing-ctl job set`), the same rule on
        every host; None: the `stream_options` given stay; udp_segments: datagrams per
        message the leader's socket hands the kernel (host_agent.transport.SEGMENTS_ENV;
        None: that variable, or the default), when no `transport` is given; hosts_group: on
        the leader, a group of the job's hosts' leaders (gloo), over which the hosts sum while
        the job waits for switch slots (window 0 in its parameters; host_agent.host_collective):
        needed only then."""
        # Refused here, on every rank: a wrong job would leave the leader waiting on the switch.
        h = params.host(host)
        if params.mode != "passing":
            raise ValueError(f"job {params.job_id} is an {params.mode} job; PassingAllreduce "
                             "needs a job created in mode passing")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite={nonfinite!r}: one of {', '.join(NONFINITE_POLICIES)}")
        self.nonfinite = nonfinite
        self.group = group
        # The local stage calls the group's own collectives (group-local ranks, leader 0), so
        # that a group the `passing` backend builds without registering it works alike.
        self._local = group if group is not None else dist.group.WORLD
        self.local_size = self._local.size()
        self.is_leader = self._local.rank() == 0
        self.session = job_session(params, group, session)
        # Known on every local rank (the options are the same on all), so that calls_behind
        # is a collective only where it can answer more than 0.
        self.quorum_mode = stream_options.get("patience") is not None
        self.stream: PooledStreamer | None = None
        # The local stage through shared memory (host_agent.local_stage), where the ranks are
        # CPU ranks of a gloo group; made at the first call that can use it.
        key = (self.session, params.job_id, host)
        _STAGES_MADE[key] = seq = _STAGES_MADE.get(key, 0) + 1
        self._stage_name = "passing-{:016x}-j{}-{}-{}".format(
            self.session, params.job_id, "".join(c if c.isalnum() else "_" for c in host), seq)
        self._stage: local_stage.SharedLocalStage | None = None
        self._stage_allowed: bool | None = None  # agreed by the local ranks at the first call
        if self.is_leader:
            if transport is None:
                transport = UdpTransport(h.host_ip, params.agent_udp_port, h.switch_ip,
                                         params.switch_udp_port, segments=udp_segments)
            # A complete sum holds every GPU of the job (hosts may differ in GPUs).
            stream_options.setdefault("total_gpus", params.gpus)
            cfg = StreamConfig(params.job_id, h.contributor_id, params.window,
                               params.streams, self.session,
                               local_gpus=self.local_size, **stream_options)
            self.stream = PooledStreamer(cfg, transport, params, params_source, poll, policy,
                                         hosts_sum=hosts_sum_over(hosts_group))

    @property
    def streamer(self) -> SlotStreamer | None:
        """The leader's stream in the job's current pool (None on other local ranks)."""
        return self.stream.streamer if self.stream is not None else None

    def close(self) -> None:
        """Release the leader's UDP socket (the group is the caller's: it is left as it is).
        Idempotent; the object cannot sum afterwards."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self._stage is not None:
            self._stage.close()
            self._stage = None

    def _shared_stage(self, work: torch.Tensor) -> local_stage.SharedLocalStage | None:
        """The shared-memory local stage for a call on `work`, or None: gloo's collectives.
        Every local rank decides alike (the same group, device and dtype)."""
        if self._stage_allowed is None:  # the first call, alike on every local rank
            self._stage_allowed = local_stage.allowed(self._local, self.local_size)
        if not self._stage_allowed or not local_stage.usable(self._local, self.local_size,
                                                              work):
            return None
        if self._stage is None:
            self._stage = local_stage.SharedLocalStage(self._local, self._local.rank(),
                                                       self.local_size, self._stage_name)
        return self._stage if self._stage.shared else None

    def calls_behind(self, numel: int, device: torch.device | str = "cpu") -> int:
        """How many of the next all-reduces of `numel` elements the other hosts have already
        completed without this one (quorum mode; 0 otherwise). Every local rank calls it at
        the same point (a broadcast from the leader over the local group, with a tensor on
        `device`), and gets the same answer; that many calls may then be made with zeros
        (no gradient computed): each returns the result the others already stepped with.
        See docs/pytorch.md, "Stragglers"."""
        if not self.quorum_mode:
            return 0
        ready = self.stream.calls_ready(numel) if self.is_leader and self.stream else 0
        stage = self._stage
        if stage is not None and stage.shared and stage.links:
            try:
                return stage.share_count(ready)
            except ChannelBroken as e:
                raise AllreduceError(str(e)) from None
        count = torch.tensor([ready], dtype=torch.int64, device=device)
        self._local.broadcast([count], local_stage.from_leader()).wait()
        return int(count.item())

    def allreduce(self, tensor: torch.Tensor, divide_by: int = 1) -> torch.Tensor:
        """Sum `tensor` over every rank of every server of the job, in place (then divided by
        `divide_by`). The local stage sums in float32 (half-precision tensors too)."""
        with torch.no_grad():
            t = tensor.detach()
            work = t if t.is_contiguous() else t.contiguous()
            local_sum = work if work.dtype == torch.float32 else work.to(torch.float32)
            stage = self._shared_stage(work)
            if stage is not None:
                stage.put(local_sum, work.dtype)
                try:
                    if not stage.agree():
                        stage = None  # the ranks do not share it: gloo, now and from now on
                except (local_stage.LocalStageMismatch, ChannelBroken) as e:
                    raise AllreduceError(str(e)) from None
            if stage is None:
                self._local.reduce([local_sum], local_stage.reduce_to_leader()).wait()
            code, quorum, message = _OK, 0, ""
            if self.is_leader:
                code, message = self._leader(stage, local_sum, work, divide_by)
                quorum = int(self.stream is not None and self.stream.cfg.patience is not None)
            if stage is not None and stage.links:
                try:
                    code, quorum, message = stage.share_status(code, quorum, message)
                except ChannelBroken as e:
                    raise AllreduceError(str(e)) from None
            else:
                code, quorum, message = self._broadcast_status(code, quorum, message,
                                                               work.device)
            if code != _OK:
                raise AllreduceError(message or _MESSAGES.get(code, "the leader failed"))
            self.quorum_mode = bool(quorum)
            if stage is None:
                self._local.broadcast([work], local_stage.from_leader()).wait()
            elif not self.is_leader:
                stage.take(work)
            if work is not t:
                t.copy_(work)
        return tensor

    def _broadcast_status(self, code: int, quorum: int, message: str,
                          device: torch.device) -> tuple[int, int, str]:
        """The leader's status on every local rank through the group (no channel)."""
        status = torch.zeros(_STATUS_BYTES, dtype=torch.uint8, device=device)
        if self.is_leader:
            encoded = message.encode()[:_STATUS_BYTES - 2]
            status[0], status[1] = code, quorum
            status[2:2 + len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
        self._local.broadcast([status], local_stage.from_leader()).wait()
        text = bytes(status[2:].cpu().tolist()).rstrip(b"\0").decode(errors="replace")
        return int(status[0]), int(status[1]), text

    def _leader(self, stage: local_stage.SharedLocalStage | None, local_sum: torch.Tensor,
                work: torch.Tensor, divide_by: int) -> tuple[int, str]:
        """The leader's call between the local stage's gathering and the status: the other
        ranks' tensors added from shared memory (if `stage`), the stream, the result handed
        back to shared memory. Any failure becomes the status, so no rank waits for it."""
        try:
            if stage is not None:
                stage.gather(local_sum)
            code, message = self._through_switch(local_sum, work, divide_by)
            if stage is not None and code == _OK:
                stage.publish(work)
            return code, message
        except Exception as e:
            return _OTHER, f"the leader failed: {type(e).__name__}: {e}"

    def _through_switch(self, local_sum: torch.Tensor, out: torch.Tensor,
                        divide_by: int) -> tuple[int, str]:
        """The leader's part: stream the host's sum, write the result into `out` (rounded
        once, to out's dtype). (status code, message for the other local ranks)."""
        if self.stream is None:
            return _OTHER, "this PassingAllreduce is closed (its process group was destroyed)"
        # float32 as the local stage summed it: the streamer quantizes it per batch in float64,
        # exactly as a float64 copy, without a pass over the whole tensor to make one.
        flat = local_sum.detach().cpu().numpy().ravel()
        complete = self.stream.cfg.complete
        # This call's policy: a live change (pool_move) applies from the next call on.
        quorum = self.stream.cfg.patience is not None
        try:
            # The streamer's own float64 sums, no copy: changed in place below, then rounded
            # once into `out`.
            sums = self.stream.allreduce_view(flat)
            # (Spread over the elements only where a quorum may have closed rounds.)
            counts = self.stream.last_counts if quorum else None
        except NonFiniteError as e:
            if self.nonfinite == "raise":
                return _NONFINITE, str(e)
            # Every host left the slots in step (the stream completed); the sum is not a number.
            # Every host failed the same call, so none reads its votes: nobody moves.
            sums = np.full(flat.size, np.nan)
            counts = np.full(flat.size, complete)
        except (SwitchTimeout, SessionBroken) as e:
            return _TIMEOUT, str(e)
        except Exception as e:  # any other failure must not leave the others waiting
            return _OTHER, f"the leader failed: {type(e).__name__}: {e}"
        if quorum and np.any(counts < complete):
            # A round closed by a quorum (docs/protocol.md) holds fewer GPUs' values: scaled
            # to the full sum they estimate, so that an average (AVG, DDP's division by the
            # world size) is the mean of the gradients that made it, as in backup-worker SGD.
            # Only in quorum mode (the same on every host in every call: checked at start, and
            # a live change applies after the same call everywhere, pool_move): a bulk-
            # synchronous sum is never scaled, whatever total it was told to expect.
            sums *= complete / np.maximum(counts, 1)
        round_into(out, sums, divide_by)
        return _OK, ""


def passing_hook(state: tuple[PassingAllreduce, int],
                 bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: `model.register_comm_hook((passing, world_size), passing_hook)`.
    Sums the bucket through PASSING and divides by the number of ranks, as DDP's default
    all-reduce averages."""
    passing, world_size = state
    buf = bucket.buffer()
    passing.allreduce(buf)
    buf.div_(world_size)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut
