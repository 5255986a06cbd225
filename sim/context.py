"""What every actor of a simulation shares: the platform, the costs, and the ways to move data,
all of which leave the timing to SimGrid.

* `send`: a blocking transfer to a mailbox, with the CPU work it costs run on the CPU that pays
  for it at the same time; it returns when both are done. A host's sends are made one after
  the other, as frames leave a NIC's queue in order.
* `transfer`: the same without a mailbox (bytes from one node to another that nobody takes as
  a message: a switch port's chunk, whose delivery is posted after it).
* `post`: a message nobody waits for. Every mailbox has a permanent receiver (`listen`), so
  the transfer starts at once whether or not its receiver is ready, and waits there until
  taken.
* `bus_async`: transfers between ranks of one host, over the host's bus.

CPU work is given in seconds and becomes an exec on the CPU that does it: the shared machine
in the emulation, else the node's own (sim.platform).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.costs import Costs
from sim.platform import CPU_SPEED, Platform


@dataclass
class Timings:
    """When each rank (host, local rank) of each job finished, simulated seconds."""

    finished: dict[int, dict[tuple[str, int], float]] = field(default_factory=dict)
    comms: int = 0

    def done(self, job: int, host: str, rank: int, clock: float) -> None:
        self.finished.setdefault(job, {})[host, rank] = clock

    def job_time(self, job: int) -> float:
        return max(self.finished[job].values())


class Pending:
    """A receive in progress. Its payload's holder must live until the comm ends: SimGrid
    writes the payload into it (dropping it early corrupts memory)."""

    def __init__(self, get_async: tuple[Any, Any]):
        self.comm, self.holder = get_async

    def test(self) -> bool:
        return self.comm.test()

    def wait(self) -> None:
        self.comm.wait()

    def get(self) -> Any:
        self.comm.wait()
        return self.holder.get()


class Inboxes:
    """Mailboxes of one actor, each with a single sender, taken in the order their transfers
    end. (One mailbox with several senders hands them over in the order they were posted: a
    transfer that ended would wait behind one still under way.)"""

    def __init__(self, sg: Any, mailboxes: list[Any]):
        self.sg = sg
        self.boxes = mailboxes
        self.pending = [Pending(b.get_async()) for b in mailboxes]

    def next(self) -> tuple[int, Any]:
        """(which mailbox, its payload) of the next transfer to end."""
        i = self.sg.Comm.wait_any([p.comm for p in self.pending])
        payload = self.pending[i].holder.get()
        self.pending[i] = Pending(self.boxes[i].get_async())
        return i, payload


class SimContext:
    def __init__(self, sg: Any, platform: Platform, costs: Costs):
        self.sg = sg
        self.platform = platform
        self.costs = costs
        self.timings = Timings()

    @property
    def clock(self) -> float:
        return self.sg.Engine.clock

    def mailbox(self, name: str) -> Any:
        return self.sg.Mailbox.by_name(name)

    def listen(self, name: str) -> Any:
        """The mailbox `name`, with the calling actor as its permanent receiver."""
        mb = self.sg.Mailbox.by_name(name)
        mb.set_receiver(self.sg.Actor.self())
        return mb

    # Receiving: always through get_async. On a mailbox with a permanent receiver, SimGrid
    # 3.32's blocking get() hands over messages in the order they were posted, the first one
    # before its transfer has ended; get_async's comm ends when the transfer has. Either takes
    # a mailbox's messages in the order they were posted, so a mailbox has one sender
    # (Inboxes waits on several).
    @staticmethod
    def expect(mailbox: Any) -> Pending:
        """A receive from `mailbox`, to test(), wait() or get() later."""
        return Pending(mailbox.get_async())

    def receive(self, mailbox: Any) -> Any:
        return Pending(mailbox.get_async()).get()

    def inboxes(self, names: list[str]) -> Inboxes:
        """The calling actor's mailboxes `names`, one sender each (see Inboxes)."""
        return Inboxes(self.sg, [self.listen(n) for n in names])

    # -- CPU --------------------------------------------------------------------------------
    # In the emulation the CPU work of every fabric node runs on the shared machine. An exec
    # cannot be moved to another host from Python here (setting Exec.host deadlocks SimGrid
    # 3.32's binding), and an actor that moved there would take its mailboxes' transfers with
    # it, so each node has a proxy actor on the machine that runs its execs one after the
    # other (each emulated host and switch process is one thread of work), created with the
    # other actors before the simulation starts.
    def start_cpu_proxies(self) -> None:
        if self.platform.machine is None:
            return
        for node in [*self.platform.hosts, *self.platform.switches]:
            proxy = self.sg.Actor.create(f"cpu/{node}", self.platform.machine,
                                         self._serve_cpu, f"cpu/{node}")
            proxy.daemonize()

    def _serve_cpu(self, name: str) -> None:
        inbox = self.listen(name)
        while True:
            seconds, reply = self.receive(inbox)
            self.sg.this_actor.execute(seconds * CPU_SPEED)
            self.mailbox(reply).put_init(None, 0).detach()

    def cpu_start(self, owner: str, seconds: float) -> Any | None:
        """Start `seconds` of CPU work on behalf of fabric node `owner` (the calling actor's
        node); None when there is nothing to do. Returns something to wait() on."""
        if seconds <= 0:
            return None
        if self.platform.machine is None:
            return self.sg.this_actor.exec_async(seconds * CPU_SPEED)
        reply = f"cpu/{owner}/done/{self.sg.this_actor.get_pid()}"
        self.mailbox(f"cpu/{owner}").put_init((seconds, reply), 0).detach()
        return Pending(self.mailbox(reply).get_async())

    def cpu(self, owner: str, seconds: float) -> None:
        ex = self.cpu_start(owner, seconds)
        if ex is not None:
            ex.wait()

    # -- transfers --------------------------------------------------------------------------
    def send(self, owner: str, mailbox: str, payload: object, nbytes: float,
             cpu_s: float = 0.0) -> None:
        """Send `nbytes` to `mailbox` from fabric node `owner` and spend `cpu_s` of CPU on it,
        both at once; return when both are done."""
        comm = self.mailbox(mailbox).put_init(payload, max(0, int(nbytes))).start()
        ex = self.cpu_start(owner, cpu_s)
        self.timings.comms += 1
        comm.wait()
        if ex is not None:
            ex.wait()

    def transfer(self, owner: str, src: str, dst: str, nbytes: float, cpu_s: float = 0.0) -> None:
        """`nbytes` from fabric node src to dst (no mailbox: nobody receives it as a message)
        and `cpu_s` of CPU on behalf of `owner`, at once; return when both are done."""
        p = self.platform
        comm = self.sg.Comm.sendto_async(p.node(src), p.node(dst), max(0, int(nbytes)))
        ex = self.cpu_start(owner, cpu_s)
        self.timings.comms += 1
        comm.wait()
        if ex is not None:
            ex.wait()

    def put_async(self, mailbox: str, payload: object, nbytes: float) -> Any:
        self.timings.comms += 1
        return self.mailbox(mailbox).put_init(payload, max(0, int(nbytes))).start()

    def post(self, mailbox: str, payload: object, nbytes: float) -> None:
        """Send and forget (the receiving mailbox must have a permanent receiver)."""
        self.timings.comms += 1
        self.mailbox(mailbox).put_init(payload, max(0, int(nbytes))).detach()

    def bus_async(self, host: str, nbytes: float) -> Any:
        """A transfer between two ranks of `host`, over its bus."""
        h = self.platform.hosts[host]
        self.timings.comms += 1
        return self.sg.Comm.sendto_async(h, h, max(0, int(nbytes)))

    def wait_all(self, activities: list[Any]) -> None:
        for a in activities:
            if a is not None:
                a.wait()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.sg.this_actor.sleep_for(seconds)

    # -- the emulation's per-frame costs -------------------------------------------------------
    def frames_cpu(self, frames: float, hops: int) -> float:
        """Kernel CPU for `frames` crossing `hops` links (0 outside the emulation)."""
        return frames * hops * self.costs.frame_cpu_s if self.costs.shared_cpu else 0.0

    def forward_cpu(self, frames: float, hops: int) -> float:
        """The switch processes' CPU for forwarding `frames` across `hops` links (each switch
        on the way forwards them once); 0 where switches forward at line rate."""
        pps = self.costs.switch_fwd_pps
        return frames * max(0, hops - 1) / pps if pps else 0.0
