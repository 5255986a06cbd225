"""A switch of a job's aggregation tree, as the controller's entries make it behave.

For every chunk of slots it waits until each member's contributions are in (the tree node's
fan-in), then either sends the sum up its uplink (a ToR under a spine: one stream) or, at the
root, multicasts the result to every member; a ToR passes a result from the spine on to its
hosts. Each member gets one copy per stream it sent (INA: each GPU its own).

The switch is one processor, first in first out: every packet it takes costs 1 /
switch_agg_pps of its CPU (the calibrated rate of the model switch or BMv2, as bench.analytic
counts them: a ToR processes its hosts' packets and the results from the spine, the spine its
ToRs' packets), and in the emulation the kernel's work for the frames it sends. Where switches
aggregate at line rate (an ASIC) neither is modelled and only the links take time.

Forwarding is cut-through, as a switch forwards packet by packet rather than chunk by chunk:
each egress port (one actor per port, chunks first in first out) starts sending chunk i once
chunk i - 1 is in from every input (by then the inputs are sending chunk i: hosts send their
chunks back to back), and the chunk is delivered when both its transfer out and every input's
transfer in have ended. Only the first chunk is stored and forwarded whole, and it is one
packet (sim.stream.ramp). Stored and forwarded whole, every chunk would cost a chunk time per
switch on the way (9% of a 100 MB call in 32 chunks through two levels).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from sim import wire
from sim.context import SimContext
from sim.jobs import JobTree, TreeNode
from sim.stream import Chunking, Contribution, Result, inbox


class Flow:
    """One direction through a switch: chunks in from `needed` contributions each, out to
    `ports` (with the payload and copies `out(port, chunk)` gives)."""

    def __init__(self, ctx: SimContext, switch: str, job: int, plan: Chunking, needed: int,
                 ports: list[str], out: Callable[[str, int], tuple[object, int]]):
        self.ctx, self.switch, self.job, self.plan = ctx, switch, job, plan
        self.needed, self.ports, self.out = needed, ports, out
        self.received: Counter[int] = Counter()
        sem = ctx.sg.Semaphore
        self._start = {p: sem(0) for p in ports}  # a permit per chunk that may start out
        self._inputs_done = {p: sem(0) for p in ports}  # a permit per chunk fully in

    def arrived(self, chunk: int, count: int) -> bool:
        """`count` contributions to `chunk` are in; True when the chunk is complete."""
        self.received[chunk] += count
        if self.received[chunk] < self.needed:
            return False
        del self.received[chunk]
        # Chunk 0 starts out when it is all in; chunk i + 1 when chunk i is.
        starts = 2 if chunk == 0 and self.plan.chunks > 1 else 1
        for p in self.ports:
            for _ in range(starts):
                self._start[p].release()
            self._inputs_done[p].release()
        return True

    def run_port(self, port: str) -> None:
        ctx = self.ctx
        src, dst = ctx.platform.node(self.switch), ctx.platform.node(port)
        for i in range(self.plan.chunks):
            self._start[port].acquire()
            payload, copies = self.out(port, i)
            nbytes = copies * self.plan.size(i) * wire.FRAME_BYTES
            ctx.timings.comms += 1
            ctx.sg.Comm.sendto_async(src, dst, int(nbytes)).wait()
            self._inputs_done[port].acquire()
            ctx.post(inbox(self.job, port, self.switch), payload, 0)


class SwitchAggregator:
    def __init__(self, ctx: SimContext, tree: JobTree, node: TreeNode, plan: Chunking):
        self.ctx, self.tree, self.node, self.plan = ctx, tree, node, plan
        job, members = tree.job_id, list(node.members)
        copies = dict(zip(node.members, node.counts, strict=True))

        def result(port: str, chunk: int) -> tuple[object, int]:
            return Result(chunk, copies[port]), copies[port]

        def summed(port: str, chunk: int) -> tuple[object, int]:
            return Contribution(node.switch, 1, chunk), 1

        self.down = Flow(ctx, node.switch, job, plan, node.fan_in if node.parent is None else 1,
                         members, result)
        self.up = (Flow(ctx, node.switch, job, plan, node.fan_in, [node.parent], summed)
                   if node.parent is not None else None)

    @property
    def ports(self) -> list[tuple[Flow, str]]:
        flows = [self.down] + ([self.up] if self.up else [])
        return [(f, p) for f in flows for p in f.ports]

    def run(self) -> None:
        # A mailbox per input (a member, or the parent's results): one sender each.
        senders = [*self.node.members, *([self.node.parent] if self.node.parent else [])]
        inboxes = self.ctx.inboxes([inbox(self.tree.job_id, self.node.switch, s)
                                    for s in senders])
        # Every contribution of every chunk in, and every result from above passed on.
        left = self.node.fan_in * self.plan.chunks
        if self.up is not None:
            left += self.plan.chunks
        while left:
            _, msg = inboxes.next()
            n = self.plan.size(msg.chunk)
            if isinstance(msg, Contribution):
                left -= msg.streams
                self._process(n * msg.streams)
                flow = self.up or self.down
                if flow.arrived(msg.chunk, msg.streams):
                    self._sending(n * (1 if flow is self.up else self.node.fan_in))
            else:  # a result from the spine
                left -= 1
                self._process(n)
                self.down.arrived(msg.chunk, 1)
                self._sending(n * self.node.fan_in)

    def _process(self, packets: int) -> None:
        pps = self.ctx.costs.switch_agg_pps
        if pps:
            self.ctx.cpu(self.node.switch, packets / pps)

    def _sending(self, frames: int) -> None:
        """The emulation's kernel work for the frames the switch sends out."""
        self.ctx.cpu(self.node.switch, self.ctx.frames_cpu(frames, 1))
