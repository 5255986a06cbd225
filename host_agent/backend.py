"""The `passing` torch.distributed backend: `dist.init_process_group("passing")` under torchrun.

torch registers it at start-up (passing/_torch_autoload.py); so does `import host_agent`. A
process group of this backend:

* sums `all_reduce` with SUM or AVG on float32, float16 and bfloat16 tensors through PASSING
  (the host's ranks reduce onto their leader over gloo, or NCCL for CUDA tensors; the leader
  streams the host's sum through the switch; the result is broadcast back), and
* hands every other collective (broadcast, all_gather, reduce_scatter, barrier, MAX/MIN/PRODUCT,
  integer or float64 tensors, point-to-point, ...) to gloo for CPU tensors and NCCL for CUDA ones,
  which it registers as its own device backends, so their results are exactly gloo's and NCCL's.

Only the default (world) group goes through the switch: the job's slots belong to one stream per
host, so a second group summing on them at the same time would corrupt both. Groups made later
with `dist.new_group` under this backend delegate everything.

The job comes from the environment (host_agent.job_source): PASSING_JOB and PASSING_CONTROLLER,
or PASSING_PARAMS, and PASSING_HOST where the host cannot be told from its addresses. The in-host
groups come from torchrun's GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE. Everything that can be
checked is checked before the first collective, on every rank at once (`_agree`): a wrong job,
a host outside it, or a torchrun layout that does not match the job's hosts is an error raised
by `init_process_group` on every rank, never a timeout at the first all-reduce.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions
from torch.distributed import PrefixStore

from host_agent.allreduce import PassingAllreduce
from host_agent.backend_checks import PassingInitError as PassingInitError
from host_agent.backend_checks import (
    _agree,
    _check_layout,
    _report,
    live_policy,
)
from host_agent.job_source import params_from_env, pool_poll
from host_agent.leaders import leaders_group
from host_agent.overlap import CallQueue, cuda_ready, done, overlap_enabled
from host_agent.session import _to_signed, new_session
from passing import BACKEND

_SUMMED = (torch.float32, torch.float16, torch.bfloat16)
_BackendType = dist.ProcessGroup.BackendType
# World groups this process has made. Every rank makes them together, so the count is the same
# on all of them; it keeps one life's store keys apart from the next (torchrun's store outlives
# destroy_process_group, and gloo would connect to the previous life's addresses).
_lives = 0


def _backends(store: dist.Store, rank: int, size: int, timeout: timedelta
              ) -> list[tuple[torch.device, _BackendType, dist.ProcessGroup]]:
    """gloo for CPU tensors, NCCL for CUDA ones where this machine has both, on `store`."""
    out = [(torch.device("cpu"), _BackendType.GLOO,
            dist.ProcessGroupGloo(PrefixStore("cpu/", store), rank, size, timeout))]
    if torch.cuda.is_available() and dist.is_nccl_available():
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        out.append((torch.device("cuda"), _BackendType.NCCL,
                    dist.ProcessGroupNCCL(PrefixStore("cuda/", store), rank, size, opts)))
    return out


def _group_of(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    """A plain ProcessGroup whose collectives run on gloo or NCCL by the tensors' device."""
    pg = dist.ProcessGroup(store, rank, size)
    for device, kind, backend in _backends(store, rank, size, timeout):
        pg._register_backend(device, kind, backend)
    pg._set_default_backend(_BackendType.GLOO)
    return pg


class PassingProcessGroup(dist.ProcessGroup):
    """See the module docstring. `passing` is None for a group that only delegates."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta,
                 passing: PassingAllreduce | None = None):
        super().__init__(rank, size)
        self._delegates = {}
        for device, kind, backend in _backends(PrefixStore("delegate/", store), rank, size,
                                               timeout):
            # Registered as this group's own device backends: a collective not
            # overridden below (reduce, gather, scatter, ...) runs on them through c10d's
            # ordinary dispatch.
            self._register_backend(device, kind, backend)
            self._delegates[device.type] = backend
        self._set_default_backend(_BackendType.GLOO)
        self.passing = passing
        self.local: dist.ProcessGroup | None = None  # the in-host group, when this group made it
        # The switch's all-reduces, in the background (host_agent.overlap).
        self.calls = CallQueue(f"passing-allreduce-r{rank}", background=overlap_enabled())
        self._destroyed = False

    def getBackendName(self) -> str:
        return BACKEND

    def shutdown(self) -> None:
        """What `destroy_process_group` calls. The in-host group is registered nowhere in
        c10d, so it is released here, while the interpreter is whole: gloo's shutdown does
        nothing, but dropping the last reference joins its threads. A gloo thread still
        running at interpreter exit aborts the process (SIGABRT, "terminate called without an
        active exception") if it releases a tensor then. The leader's UDP port is released
        too."""
        self._destroyed = self.passing is not None
        self.calls.close()  # the calls made before run first
        if self.passing is not None:
            self.passing.close()
            self.passing = None  # it holds the in-host group too
        if self.local is not None:
            self.local.shutdown()
            self.local = None  # the last reference: gloo joins its threads now, not at exit
        super().shutdown()

    def _summed_by_switch(self, tensors: list[torch.Tensor], op: dist.ReduceOp) -> bool:
        # `==`, not `in`: the ReduceOp an option holds is not equal to the enum on the left.
        return (self.passing is not None and (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG)
                and all(t.dtype in _SUMMED and t.device.type in ("cpu", "cuda")
                        for t in tensors))

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None:
            opts = dist.AllreduceOptions()
        if self._destroyed:
            # Said, rather than summed on gloo behind the caller's back (a model holding the
            # group after destroy_process_group would no longer go through the switch).
            raise RuntimeError("passing backend: all_reduce on a world group that "
                               "destroy_process_group destroyed; init_process_group"
                               "(\"passing\") makes a new one")
        op = opts.reduceOp
        avg = op == dist.ReduceOp.AVG
        if self._summed_by_switch(tensors, op):
            return self._through_switch(tensors, self.size() if avg else 1)
        if not avg:
            return self._delegate(tensors).allreduce(tensors, opts)
        # gloo has no AVG; this backend offers it for every dtype: sum, then divide (outside
        # autograd, as the collective itself is).
        summed = dist.AllreduceOptions()
        summed.reduceOp = dist.ReduceOp.SUM
        self._delegate(tensors).allreduce(tensors, summed).wait()
        with torch.no_grad():
            for t in tensors:
                t = t.detach()
                if t.is_floating_point() or t.is_complex():
                    t.div_(self.size())
                else:
                    t.copy_(torch.div(t, self.size(), rounding_mode="trunc"))
        return done(tensors)

    def _through_switch(self, tensors: list[torch.Tensor], divide_by: int) -> dist.Work:
        """Each tensor summed through the switch, in the background after the calls before
        (host_agent.overlap); the Work completes when all are."""
        passing, ready = self.passing, cuda_ready(tensors)

        def call() -> None:
            if ready is not None:
                ready.synchronize()
            for t in tensors:
                passing.allreduce(t, divide_by=divide_by)
        return self.calls.submit(call, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        one = dist.AllreduceOptions()
        one.reduceOp = opts.reduceOp
        if self._summed_by_switch(tensors, opts.reduceOp):
            avg = opts.reduceOp == dist.ReduceOp.AVG
            return self._through_switch(list(tensors), self.size() if avg else 1)
        if opts.reduceOp == dist.ReduceOp.AVG:
            for t in tensors:
                self.allreduce([t], one).wait()
            return done(tensors)
        return self._delegate(tensors).allreduce_coalesced(tensors, opts)

    # The collectives below are handed to the device's backend here, in Python, rather than
    # left to c10d's dispatch. torch's trampoline for a Python ProcessGroup (PyProcessGroup's
    # WORK_OVERRIDE) runs the inherited collective with the GIL still held, and gloo enqueues
    # it under its work lock; gloo's worker, meanwhile, may be freeing the previous
    # collective's tensors under that lock and need the GIL to drop their Python objects. The
    # two then wait for each other forever (seen: all_gather_object after all_gather, about
    # one run in five). Called from here, the backend's own bindings release the GIL first.
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        return self._delegate(input_tensors).allgather(output_tensors, input_tensors, opts)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._delegate(tensors).broadcast(tensors, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._delegate(output_tensors).reduce_scatter(output_tensors, input_tensors, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._delegate([input]).alltoall_base(output, input, output_split_sizes,
                                                     input_split_sizes, opts)

    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        # On the device barrier() chose (NCCL's barrier is an all-reduce on a GPU), as c10d's
        # own dispatch does; on gloo where none was chosen.
        kind = opts.device.type if opts.device is not None else "cpu"
        self.calls.drain()  # as gloo's barrier, after this rank's earlier collectives
        return self._delegates.get(kind, self._delegates["cpu"]).barrier(opts)

    def send(self, tensors, dst_rank, tag):
        return self._delegate(tensors).send(tensors, dst_rank, tag)

    def recv(self, tensors, src_rank, tag):
        return self._delegate(tensors).recv(tensors, src_rank, tag)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        # The backends' Python bindings have no coalesced form: one gather per pair.
        opts = opts if opts is not None else AllgatherOptions()
        for out, inp in zip(outputs, inputs, strict=False):
            self._delegate([inp])._allgather_base(out, inp, opts).wait()
        return done(outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        for out, inp in zip(outputs, inputs, strict=False):
            self._delegate([inp])._reduce_scatter_base(out, inp, opts).wait()
        return done(outputs)

    def _delegate(self, tensors: list[torch.Tensor]):
        kind = tensors[0].device.type if tensors else "cpu"
        if kind not in self._delegates:
            raise RuntimeError(f"passing backend: no backend for {kind} tensors here "
                               f"(have {', '.join(self._delegates)})")
        return self._delegates[kind]


def calls_behind(numel: int, device: torch.device | str = "cpu") -> int:
    """How many of its next `all_reduce` calls of `numel` elements this rank's host may skip
    computing: the other hosts closed those rounds without it (a quorum, PASSING_PATIENCE) and
    their results are already here. 0 under any other backend, or without a quorum.

    Every rank of this host calls it at the same point of its loop (it is a broadcast inside
    the host; other hosts need not call it). A loop then makes that many all-reduces of
    zeros and steps with their results, as the other hosts did, before computing again::

        for _ in range(calls_behind(flat.numel())):
            flat.zero_()
            dist.all_reduce(flat, op=dist.ReduceOp.AVG)  # returns at once, the others' mean
            apply(flat)
    """
    pg = dist.group.WORLD if dist.is_initialized() else None
    passing = getattr(pg, "passing", None) if isinstance(pg, PassingProcessGroup) else None
    if passing is None:
        return 0
    pg.calls.drain()  # a collective of the in-host group: after the calls in flight
    return passing.calls_behind(numel, device)


def create_process_group(store: dist.Store, rank: int, size: int,
                         timeout: timedelta) -> dist.ProcessGroup:
    """The creator torch calls for `init_process_group("passing")` and for `new_group` under
    it (register_backend's non-extended signature)."""
    global _lives
    if dist.is_initialized():  # a group made after the world: delegates everything
        return PassingProcessGroup(store, rank, size, timeout)
    _lives += 1
    store = PrefixStore(f"passing-life{_lives}/", store)
    report, found = _report(os.environ, timeout)
    reports = _agree(store, "passing/config", rank, size, report, timeout)
    params, host, options = found
    nodes = _check_layout(params, reports)
    node = reports[rank]["node"]
    local = _group_of(PrefixStore(f"passing/local{node}/", store), nodes[node].index(rank),
                      len(nodes[node]), timeout)
    pg = PassingProcessGroup(store, rank, size, timeout)
    pg.local = local
    session = torch.tensor([_to_signed(new_session())], dtype=torch.int64)
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg._delegates["cpu"].broadcast([session], opts).wait()
    error = ""
    try:
        env = dict(os.environ)
        # A job waiting for switch slots sums over its hosts' leaders meanwhile (every rank
        # holds the same parameters: checked above).
        hosts_group = leaders_group(store, params, host, timeout) \
            if params.window == 0 and nodes[node].index(rank) == 0 else None
        pg.passing = PassingAllreduce(params, host, local, session=int(session.item()) & (
            (1 << 64) - 1), nonfinite="propagate", total_gpus=size,
            params_source=lambda: params_from_env(env), poll=pool_poll(env),
            policy=live_policy(env), hosts_group=hosts_group, **options)
    except (OSError, RuntimeError, ValueError) as e:  # e.g. the leader cannot bind its port
        error = f"{type(e).__name__}: {e}"
    _agree(store, "passing/ready", rank, size, {"error": error, "host": host}, timeout)
    return pg
