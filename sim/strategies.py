"""Each strategy's actors for one job, placed on the platform's hosts and switches.

* `passing`: each host's leader reduces its GPUs' tensors over the bus (sim.local), streams
  the sum through the job's tree with the job's window (sim.stream, sim.switch; the tree is the
  controller's plan, sim.jobs), and hands the result back to its GPUs.
* `ina`: every GPU streams its own tensor through the tree, no local stage.
* `ring`: gloo's ring over every rank; `hier-ring`: local reduce, ring over the leaders, local
  broadcast; `ps`: the parameter server (sim.collectives).

Actors that receive posts are created before those that send to them, so that each mailbox
has its permanent receiver before the first transfer to it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.topology import Topology
from passing import protocol as P
from sim.collectives import ParameterServer, Ring
from sim.context import SimContext
from sim.jobs import SlotBook, job_tree
from sim.local import local_broadcast, local_reduce
from sim.stream import HostStreams, chunking
from sim.switch import SwitchAggregator

STRATEGIES = ("passing", "ina", "ring", "hier-ring", "ps")


@dataclass(frozen=True)
class JobRun:
    """One job of a simulation: its hosts, strategy, tensor and window."""

    job_id: int
    hosts: tuple[str, ...]
    strategy: str
    size_bytes: int
    window: int = 256
    # The call repeats the size of the call before and speculates on its scale: no exponent
    # packets (docs/protocol.md, "Speculative scale"). bench.sweep's runs that make a warm-up
    # call first speculate; its long calls (one call, no warm-up) do not.
    speculating: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}: choose from {', '.join(STRATEGIES)}")


class Launcher:
    """Creates the actors of jobs on one platform; `notes` collects what the caller should
    know about the model (an INA job beyond the switch's contributor ids, ...)."""

    def __init__(self, ctx: SimContext, topo: Topology, max_chunks: int, max_steps: int,
                 spread_roots: bool = True):
        self.ctx, self.topo = ctx, topo
        self.max_chunks, self.max_steps = max_chunks, max_steps
        self.notes: list[str] = []
        # The jobs' pools so far: the controller spreads jobs over the spines by them.
        self.slots = SlotBook() if spread_roots else None

    def _actor(self, name: str, node: str, fn, *args) -> None:
        self.ctx.sg.Actor.create(name, self.ctx.platform.node(node), fn, *args)

    def _gpus(self, host: str) -> int:
        return self.topo.hosts[host].gpus

    def launch(self, job: JobRun) -> None:
        if job.strategy in ("passing", "ina"):
            self._switched(job)
        elif job.strategy == "ps":
            self._ps(job)
        else:
            self._ring(job)

    # -- passing, ina --------------------------------------------------------------------------
    def _switched(self, job: JobRun) -> None:
        tree = job_tree(self.topo, list(job.hosts), job.strategy, job.window, job.job_id,
                        self.slots)
        if tree.beyond_bitmap:
            self.notes.append(f"job {job.job_id}: INA needs more than {P.MAX_FAN_IN} "
                              "contributors at a switch; the controller would refuse it")
        plan = chunking(job.size_bytes, job.window, job.speculating, self.max_chunks,
                        hops=2 * tree.depth)
        for node in tree.nodes.values():
            agg = SwitchAggregator(self.ctx, tree, node, plan)
            self._actor(f"j{job.job_id}-{node.switch}", node.switch, agg.run)
            for flow, port in agg.ports:
                self._actor(f"j{job.job_id}-{node.switch}-{port}", node.switch, flow.run_port,
                            port)
        for host in job.hosts:
            streams = HostStreams(self.ctx, job.job_id, host, tree.tor_of(host),
                                  tree.streams(host), plan)
            self._actor(f"j{job.job_id}-{host}", host, self._switched_host, job, streams)

    def _switched_host(self, job: JobRun, streams: HostStreams) -> None:
        ctx, host, gpus = self.ctx, streams.host, self._gpus(streams.host)
        local = job.strategy == "passing" and gpus > 1
        if local:
            local_reduce(ctx, host, gpus, job.size_bytes)
        streams.run()
        if local:
            local_broadcast(ctx, host, gpus, job.size_bytes)
        for rank in range(gpus):
            ctx.timings.done(job.job_id, host, rank, ctx.clock)

    # -- ring, hier-ring -----------------------------------------------------------------------
    def _ring(self, job: JobRun) -> None:
        hosts = list(job.hosts)
        gpus = {self._gpus(h) for h in hosts}
        if len(gpus) != 1:
            raise ValueError(f"job {job.job_id}: ring needs the same GPUs on every host")
        g = gpus.pop()
        hier = job.strategy == "hier-ring"
        ring = Ring(self.ctx, job.job_id, hosts, 1 if hier else g, job.size_bytes,
                    self.max_steps)
        for i, host in enumerate(hosts):
            self._actor(f"j{job.job_id}-{host}", host, self._ring_host, job, ring, i, g, hier)

    def _ring_host(self, job: JobRun, ring: Ring, index: int, gpus: int, hier: bool) -> None:
        ctx, host = self.ctx, ring.hosts[index]
        op_s = ctx.costs.local_op_s
        if hier and gpus > 1:
            local_reduce(ctx, host, gpus, job.size_bytes, op_s)
        ring.run_host(index)
        if hier and gpus > 1:
            local_broadcast(ctx, host, gpus, job.size_bytes, op_s)
        for rank in range(gpus):
            ctx.timings.done(job.job_id, host, rank, ctx.clock)

    # -- ps ------------------------------------------------------------------------------------
    def _ps(self, job: JobRun) -> None:
        hosts = list(job.hosts)
        ps = ParameterServer(self.ctx, job.job_id, hosts, self._gpus(hosts[0]), job.size_bytes,
                             self.max_chunks)
        for w in ps.workers:
            self._actor(f"j{job.job_id}-pull-{w}", ps.server, ps.run_puller, w)
        for w in ps.workers:
            self._actor(f"j{job.job_id}-{w}", w, self._ps_worker, job, ps, w)

    def _ps_worker(self, job: JobRun, ps: ParameterServer, host: str) -> None:
        ps.run_worker(host)
        first = 1 if host == ps.server else 0
        for rank in range(first, first + ps.workers[host]):
            self.ctx.timings.done(job.job_id, host, rank, self.ctx.clock)
