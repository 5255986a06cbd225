"""All-reduces run by passing-agent on every host of a job, PASSING's or a baseline strategy's,
and what each host link carried during them."""

from __future__ import annotations

from passing.contract import JobParams
from passing_agent.options import IDLE_GRACE_S, RunOptions, command_budget_s
from passing_agent.workloads import DEFAULT_MODEL
from topologies import link_rate
from topologies.agent_servers import AgentServers
from topologies.control_plane import ControlPlane
from topologies.mininet_fabric import MininetFabric


def link_bytes_per_call(report: dict, delta: tuple[int, int], calls: int
                        ) -> tuple[float, float]:
    """(tx, rx) bytes a host link carried per timed call: as the host's agent counted them
    around its timed calls (passing_agent.worker), else the counters' `delta` over all `calls`,
    warm-ups included (an agent that failed, or could not read its interface)."""
    if "timed_tx_bytes" in report:
        return report["timed_tx_bytes"], report["timed_rx_bytes"]
    return delta[0] / calls, delta[1] / calls


class AllreduceRuns:
    """All-reduces on `fabric`'s hosts, by the `agents` there, over jobs of `control`."""

    def __init__(self, fabric: MininetFabric, control: ControlPlane, agents: AgentServers):
        self.fabric = fabric
        self.control = control
        self.agents = agents

    def allreduce(self, size: str = "1M", job_id: int | None = None, iters: int = 2,
                  timeout: float = 20.0, strategy: str = "passing",
                  train_steps: int = 0, train_model: str = DEFAULT_MODEL,
                  eval_every: int = 0, warmup: int = 1,
                  rendezvous_timeout: float = 60.0) -> dict[str, dict]:
        """Run passing-agent on every host of the job at once; their JSON reports. Baseline
        strategies run over the same hosts and links: ring, hier-ring and ps without the
        switch's aggregation (their traffic is ordinary L2 forwarding), ina through the
        switch with every GPU rank streaming (on the job's INA companion, see
        ControlPlane.ina_companion). Each host makes `warmup` untimed calls, then `iters`
        timed ones, and checks every one. With train_steps the agents train the MLP
        `train_model` instead (passing-agent --train --model, accuracy every `eval_every`
        steps). `rendezvous_timeout`: how long the hosts' TCP meetings (session, process
        groups, the first start line) may take; under heavy loss on every link TCP's backoff
        alone can take a minute."""
        control = self.control
        job_id = job_id if job_id is not None else min(control.jobs)
        params = control.jobs.get(job_id) or control.create_job(job_id)
        job = JobParams.load(params)
        if strategy == "ina" and job.mode != "ina":
            params = control.ina_companion(job_id)
            job = JobParams.load(params)
        hosts = job.host_names
        before = {h: self.host_link_bytes(h) for h in hosts}
        # Each host's agent stays up between calls (topologies/agent_servers.py).
        commands = {h: ["--params", str(params), "--host", h, "--size", size,
                        "--iters", str(iters), "--warmup", str(warmup), "--json",
                        "--timeout", str(timeout), "--strategy", strategy,
                        "--ifname", self.fabric.node(h).defaultIntf().name,
                        "--train", str(train_steps), "--model", train_model,
                        "--eval-every", str(eval_every),
                        "--rendezvous-timeout", str(rendezvous_timeout),
                        "--udp-segments", str(self.fabric.udp_segments(h))] for h in hosts}
        # A hung agent (e.g. a baseline's rendezvous) must not hang the caller; the agent's
        # own bound, and its ranks' tear-down, come first, with a clearer error.
        opts = RunOptions(iters=iters, warmup=warmup, timeout=timeout, train_steps=train_steps,
                          model=train_model, rendezvous_timeout=rendezvous_timeout)
        out = self.agents.run(commands, command_budget_s(opts) + IDLE_GRACE_S + 20)
        if not train_steps:
            for h in hosts:
                self._link_use(out[h], h, before[h], iters + warmup)
        return out

    def host_link_bytes(self, host: str) -> tuple[int, int]:
        """(tx, rx) bytes of the host's data interface so far, read in its namespace."""
        node = self.fabric.node(host)
        intf = node.defaultIntf().name
        tx, rx = node.cmd(f"cat /sys/class/net/{intf}/statistics/tx_bytes "
                          f"/sys/class/net/{intf}/statistics/rx_bytes").split()
        return int(tx), int(rx)

    def _link_use(self, report: dict, host: str, before: tuple[int, int], calls: int) -> None:
        """Add to an agent's report the bytes its host link carried per timed call (as the
        agent counted them around its timed calls; else the counters' delta over all `calls`,
        warm-ups included) and, for a shaped link, how busy the link was during a call: far
        below 1, the CPU, not the emulated link, set the time (README, "Running a
        topology")."""
        if not report.get("ok") or not report.get("mean_s"):
            return
        delta = tuple(b - a for a, b in zip(before, self.host_link_bytes(host), strict=True))
        per_call = max(link_bytes_per_call(report, delta, calls))
        report["link_bytes_per_call"] = per_call
        bw = self.fabric.topo.hosts[host].link.bw
        report["link_mbps"] = bw or 0
        if bw:
            report["link_busy"] = link_rate.busy(per_call, report["mean_s"], bw)
