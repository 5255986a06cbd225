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

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions
from torch.distributed import PrefixStore

from host_agent.allreduce import PassingAllreduce
from host_agent.job_source import params_from_env, pool_poll, this_host
from host_agent.leaders import leaders_group
from host_agent.overlap import CallQueue, done, overlap_enabled
from host_agent.pool_move import Policy
from host_agent.session import _to_signed, new_session
from host_agent.stream_api import StreamConfig
from passing import BACKEND
from passing.contract import JobParams, parse_patience

_SUMMED = (torch.float32, torch.float16, torch.bfloat16)
_BackendType = dist.ProcessGroup.BackendType
# World groups this process has made. Every rank makes them together, so the count is the same
# on all of them; it keeps one life's store keys apart from the next (torchrun's store outlives
# destroy_process_group, and gloo would connect to the previous life's addresses).
_lives = 0


class PassingInitError(RuntimeError):
    """`init_process_group("passing")` cannot start: the message says which rank and why."""


@dataclass(frozen=True)
class _Layout:
    """Where this rank sits, as torchrun describes it."""

    node: int  # GROUP_RANK: the node (host) this rank runs on
    local_rank: int
    local_size: int


def torchrun_layout(env: Mapping[str, str] = os.environ) -> _Layout:
    """This rank's node and local rank from torchrun's environment."""
    names = ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    missing = [n for n in names if n not in env]
    if missing:
        raise PassingInitError(
            f"the passing backend needs torchrun's {', '.join(names)} to know which ranks share "
            f"a host; {', '.join(missing)} not set (start the script with torchrun, or set them)")
    try:
        node, local_rank, local_size = (int(env[n]) for n in names)
    except ValueError:
        raise PassingInitError(f"{', '.join(f'{n}={env[n]!r}' for n in names)}: not "
                               "integers") from None
    if not 0 <= local_rank < local_size or node < 0:
        raise PassingInitError(f"GROUP_RANK={node} LOCAL_RANK={local_rank} "
                               f"LOCAL_WORLD_SIZE={local_size}: not a valid layout")
    return _Layout(node, local_rank, local_size)


def _agree(store: dist.Store, phase: str, rank: int, size: int, report: dict,
           timeout: timedelta) -> list[dict]:
    """Every rank's `report` for `phase`, on every rank; raises PassingInitError on all of them
    when any rank reported an error. Over the store, not a collective: a rank whose
    configuration is wrong reaches here without having built any group."""
    store.set(f"{phase}/rank{rank}", json.dumps(report))
    keys = [f"{phase}/rank{r}" for r in range(size)]
    try:
        store.wait(keys, timeout)
    except (RuntimeError, dist.DistStoreError) as e:
        raise PassingInitError(f"passing backend ({phase}): not every rank reported within "
                               f"{timeout.total_seconds():.0f}s: {e}") from None
    reports = [json.loads(v) for v in store.multi_get(keys)]
    failed = [(r, x) for r, x in enumerate(reports) if x.get("error")]
    if failed:
        r, x = failed[0]
        where = f"rank {r}" + (f" (host {x['host']})" if x.get("host") else "")
        more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
        raise PassingInitError(f"passing backend: {where}: {x['error']}{more}")
    return reports


def _check_layout(params: JobParams, reports: list[dict]) -> dict[int, list[int]]:
    """The global ranks of each node, after checking that every rank holds the same job and
    that the nodes are the job's hosts, one node per host (the switch waits for exactly one
    stream per host)."""
    mine = params_digest(params)
    other = next((r for r, x in enumerate(reports) if x["digest"] != mine), None)
    if other is not None:
        x = reports[other]
        raise PassingInitError(
            f"the ranks do not hold the same job parameters: rank {other} (host {x['host']}) "
            f"has job {x['job']}" + (" with other parameters" if x["job"] == params.job_id
                                     else "") + f", others job {params.job_id}: give every "
            "node the same PASSING_JOB and PASSING_CONTROLLER (or PASSING_PARAMS)")
    # Ranks that close rounds differently would scale short sums differently and disagree on
    # the staleness bound: their replicas would drift apart without an error.
    # Which of the two the environment sets matters too: it wins over a live change of the
    # job's policy (live_policy), so ranks that agree only by chance would part at the change.
    quorum = [(x.get("patience"), x.get("staleness"), x.get("policy_env")) for x in reports]
    other = next((r for r, q in enumerate(quorum) if q != quorum[0]), None)
    if other is not None:
        raise PassingInitError(
            f"the ranks do not set PASSING_PATIENCE / PASSING_STALENESS alike: rank {other} "
            f"(host {reports[other]['host']}) has {quorum[other]}, rank 0 {quorum[0]}: set "
            "them the same on every node, or on none")
    nodes: dict[int, list[int]] = {}
    for r, x in enumerate(reports):
        nodes.setdefault(x["node"], []).append(r)
    host_of: dict[int, str] = {}
    for node, ranks in nodes.items():
        hosts = {reports[r]["host"] for r in ranks}
        sizes = {reports[r]["local_size"] for r in ranks}
        if len(hosts) > 1:
            raise PassingInitError(f"node {node}'s ranks name different hosts: "
                                   f"{', '.join(sorted(hosts))} (set one PASSING_HOST per node)")
        if sizes != {len(ranks)}:
            raise PassingInitError(f"node {node} has {len(ranks)} ranks but LOCAL_WORLD_SIZE "
                                   f"{', '.join(map(str, sorted(sizes)))}")
        host_of[node] = hosts.pop()
    named = sorted(host_of.values())
    twice = sorted({h for h in named if named.count(h) > 1})
    if twice:
        raise PassingInitError(f"host {', '.join(twice)} is claimed by more than one torchrun "
                               "node: give each node its own PASSING_HOST")
    if named != params.host_names:
        missing = sorted(set(params.host_names) - set(named))
        raise PassingInitError(
            f"job {params.job_id} has hosts {', '.join(params.host_names)}, but the torchrun "
            f"nodes are {', '.join(named)}: "
            + (f"no node for {', '.join(missing)} (the switch would wait for it); " if missing
               else "")
            + f"start one node per host (torchrun --nnodes {len(params.host_names)})")
    return {node: sorted(ranks) for node, ranks in nodes.items()}


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


def _cuda_ready(tensors: list[torch.Tensor]) -> torch.cuda.Event | None:
    """For CUDA tensors, an event on the caller's current stream: the background thread waits
    for it, so that it sums what the kernels queued before the call (a gradient bucket's
    backward) have written."""
    if not any(t.device.type == "cuda" for t in tensors):
        return None
    event = torch.cuda.Event()
    event.record()
    return event


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
        passing, ready = self.passing, _cuda_ready(tensors)

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


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    text = env.get(name)
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise PassingInitError(f"{name}={text!r}: not a positive, finite number of seconds")
    return seconds


def stream_options(timeout: timedelta, env: Mapping[str, str] = os.environ,
                   params: JobParams | None = None) -> dict:
    """How long an all-reduce waits for the switch's results before it fails: the process
    group's timeout, as gloo and NCCL wait for a slow rank (a host busy evaluating or saving a
    checkpoint is late, not gone); PASSING_TIMEOUT (seconds) overrides it.

    Quorum (docs/protocol.md, "Rounds, quorum and late contributions"; the job's quorum is
    set with passing-ctl job create/set --quorum): PASSING_PATIENCE (seconds) is how long a
    packet waits for the other hosts before this host asks the switch to close its round
    (MIN..MAX: adaptive, the time rounds with every host in time take, within those bounds),
    PASSING_STALENESS (default 1) how many calls in a row may leave some GPU out before a
    call waits for everyone. Unset, the job's own (`params`: passing-ctl job create/set
    --patience, --staleness) apply; unset there too, every round waits for everyone."""
    options: dict = {"deadline": _seconds(env, "PASSING_TIMEOUT") or timeout.total_seconds()}
    text = env.get("PASSING_PATIENCE")
    patience = params.patience if params is not None else ()
    if text is not None:
        try:
            patience = parse_patience(text)
        except ValueError:
            raise PassingInitError(f"PASSING_PATIENCE={text!r}: seconds, positive and finite, "
                                   "or MIN..MAX seconds with MIN <= MAX (adaptive)") from None
    if patience:
        options["patience"] = patience[-1]
        if len(patience) == 2:
            options["patience_min"] = patience[0]
    text = env.get("PASSING_STALENESS")
    if text is not None:
        if not text.strip().isdigit():
            raise PassingInitError(f"PASSING_STALENESS={text!r}: a whole number of calls, 0 "
                                   "or more")
        options["staleness"] = int(text)
    elif params is not None and params.patience:
        options["staleness"] = params.staleness
    return options


def live_policy(env: Mapping[str, str]) -> Policy:
    """The patience and staleness bound a rank changes to when the job's policy changes while
    it runs (`passing-ctl job set`; host_agent.pool_move): what stream_options gives for the
    new parameters, so PASSING_PATIENCE and PASSING_STALENESS still win over the job's."""
    def rule(params: JobParams) -> dict:
        options = stream_options(timedelta(0), env, params)
        return {"patience": options.get("patience"),
                "patience_min": options.get("patience_min"),
                "staleness": options.get("staleness", StreamConfig.staleness)}
    return rule


def _report(env: Mapping[str, str], timeout: timedelta) -> tuple[dict, tuple]:
    """This rank's half of the start-up check: its node, host and job, or the error it met."""
    try:
        layout = torchrun_layout(env)
        stream_options(timeout, env)  # the environment's own mistakes first
        params = params_from_env(env)
        options = stream_options(timeout, env, params)
        pool_poll(env)
        overlap_enabled(env)
        host = this_host(params, env)
        if params.mode != "passing":
            raise PassingInitError(f"job {params.job_id} is an {params.mode} job; the passing "
                                   "backend needs a job created in mode passing")
    except (PassingInitError, RuntimeError, ValueError) as e:
        return {"error": str(e)}, ()
    return ({"node": layout.node, "host": host, "local_size": layout.local_size,
             "job": params.job_id, "digest": params_digest(params),
             "patience": [options.get("patience_min"), options.get("patience")],
             "staleness": options.get("staleness"),
             "policy_env": [name in env for name in ("PASSING_PATIENCE", "PASSING_STALENESS")]},
            (params, host, options))


def params_digest(params: JobParams) -> str:
    """Equal on two ranks only if they hold the same job parameters."""
    return hashlib.sha256(params.to_json(indent=None).encode()).hexdigest()


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
