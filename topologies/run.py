"""`make run-topology`: Mininet with PASSING switches, the controller, a default job over every
host, and the Mininet CLI with PASSING commands:

    allreduce [SIZE] [--job ID] [--iters N] [--strategy passing|ina|ring|hier-ring|ps]
                                     agents on every host of the job; time, goodput, correct?
                                     (ina runs on job 1000+ID, made on first use)
    train [--job ID] [--backend passing|gloo] [--epochs N] [--nproc-per-node G]
          [--hosts H1,H2] [--timeout S] [--script PATH] [-- SCRIPT ARGS...]
                                     PyTorch DDP training (examples/train_ddp.py, or PATH) with
                                     torchrun on every host of the job; a rank is ok when it
                                     exits 0: loss, accuracy, it/s per rank from train_ddp.py's
                                     report, another script's last output line
    jobs | slots | stats [ID]        the controller's view (as passing-ctl prints it)
    loss NODE1 NODE2 PERCENT         random loss on that link, both directions (0 removes it)

The hosts also sit on a management network (a bridge in the root namespace, 172.31.0.0/16,
beside the aggregation fabric) where the controller serves the agents' job parameters
(`passing-ctl serve`; its URL is printed at start): torchrun ranks get PASSING_JOB,
PASSING_CONTROLLER and PASSING_HOST from `train`.

    sudo .venv/bin/python -m topologies.run --topo topologies/star.json --target auto
    sudo python -m topologies.run --topo leafspine     # a shipped topology, by name
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from mininet.cli import CLI
from mininet.log import setLogLevel

from controller import cli as ctl_cli
from controller.topology import TopologyError, load
from passing.pipeline_files import topology_file
from passing_agent import STRATEGIES
from topologies.cpu_load import CpuSampler, call_windows
from topologies.exclusive import NetworkBusy
from topologies.network import DEFAULT_WINDOWS, PassingNetwork
from topologies.reports import report_allreduce, report_train, report_windows


def allreduce_measured(pnet: PassingNetwork, *args, **kwargs) -> tuple[dict[str, dict],
                                                                         float | None]:
    """PassingNetwork.allreduce, and how busy this machine's CPUs were during its timed calls
    (topologies.cpu_load; None where that could not be read)."""
    with CpuSampler() as cpu:
        res = pnet.allreduce(*args, **kwargs)
    return res, cpu.busy_during(call_windows(res.values()))


class PassingCLI(CLI):
    prompt = "passing> "

    def __init__(self, pnet: PassingNetwork, **kw):
        self.pnet = pnet
        self.last_windows: dict[str, dict] = {}  # the hosts' reports of the last allreduce
        super().__init__(pnet.net, **kw)

    def do_allreduce(self, line: str) -> None:
        """allreduce [SIZE] [--job ID] [--iters N] [--strategy passing|ina|ring|hier-ring|ps]:
        run passing-agent on every host of the job (SIZE in float32 values, K/M suffixes);
        ina uses the job's switch-only companion, job 1000+ID."""
        ap = argparse.ArgumentParser(prog="allreduce", add_help=False)
        ap.add_argument("size", nargs="?", default="1M")
        ap.add_argument("--job", type=int, default=None)
        ap.add_argument("--iters", type=int, default=2)
        ap.add_argument("--strategy", default="passing", choices=STRATEGIES)
        try:
            args = ap.parse_args(shlex.split(line))
        except SystemExit:
            print(f"usage: allreduce [SIZE] [--job ID] [--iters N] "
                  f"[--strategy {'|'.join(STRATEGIES)}]")
            return
        res, cpu = allreduce_measured(self.pnet, args.size, args.job, args.iters,
                                      strategy=args.strategy)
        if args.strategy == "passing":
            self.last_windows = res
        report_allreduce(res, cpu)

    def do_train(self, line: str) -> None:
        """train [--job ID] [--backend passing|gloo] [--epochs N] [--nproc-per-node G]
        [--hosts H1,H2] [--timeout S] [--script PATH] [--env NAME=VALUE ...] [-- SCRIPT
        ARGS...]: torchrun on every host of the job (default: the first job; --hosts: those
        instead) running a DDP training script (default examples/train_ddp.py), with NAME set
        to VALUE in its ranks' environment (e.g. PASSING_OVERLAP=0); one line per rank (ok
        when it exited 0: its report, or its last output line; else its exit code and error)
        and a verdict."""
        words = shlex.split(line)
        extra = words[words.index("--") + 1:] if "--" in words else []
        words = words[:words.index("--")] if "--" in words else words
        ap = argparse.ArgumentParser(prog="train", add_help=False)
        ap.add_argument("--job", type=int, default=None)
        ap.add_argument("--backend", default="passing")
        ap.add_argument("--epochs", type=int, default=1)
        ap.add_argument("--nproc-per-node", type=int, default=None)
        ap.add_argument("--hosts", default=None)
        ap.add_argument("--timeout", type=float, default=300.0)
        ap.add_argument("--script", default=None)
        ap.add_argument("--env", action="append", default=[])
        usage = ("usage: train [--job ID] [--backend passing|gloo] [--epochs N] "
                 "[--nproc-per-node G] [--hosts H1,H2] [--timeout S] [--script PATH] "
                 "[--env NAME=VALUE ...] [-- SCRIPT ARGS...]")
        try:
            args = ap.parse_args(words)
        except SystemExit:
            print(usage)
            return
        bad = [e for e in args.env if "=" not in e or not e.split("=", 1)[0]]
        if bad:
            print(f"train: --env {bad[0]!r}: NAME=VALUE\n{usage}")
            return
        try:
            res = self.pnet.train(args.job, backend=args.backend,
                                  nproc_per_node=args.nproc_per_node, script=args.script,
                                  args=("--epochs", str(args.epochs), *extra),
                                  timeout=args.timeout,
                                  hosts=args.hosts.split(",") if args.hosts else None,
                                  env=dict(e.split("=", 1) for e in args.env))
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"train: {e}")
            return
        report_train(res)

    def _ctl(self, *argv: str) -> None:
        try:
            ctl_cli.main(list(argv), ctl=self.pnet.ctl)
        except SystemExit:  # a bad command line: passing-ctl printed its usage
            pass
        self.pnet.ctl.disconnect()

    def postcmd(self, stop, line):
        # Idle between commands: let passing-ctl in another shell take the switches.
        self.pnet.ctl.disconnect()
        return super().postcmd(stop, line)

    def do_jobs(self, line: str) -> None:
        """jobs: the controller's job table."""
        self._ctl("job", "list")

    def do_job(self, line: str) -> None:
        """job SUBCOMMAND ...: passing-ctl job on this network's controller, e.g.
        job set 1 --quorum 3 --patience 0.02..0.05 (the straggler policy the next train
        uses), job show 1, job create 2 --hosts h1,h2 --window 16."""
        self._ctl("job", *shlex.split(line))

    def do_slots(self, line: str) -> None:
        """slots: slot occupancy per switch."""
        self._ctl("slots")

    def do_stats(self, line: str) -> None:
        """stats [ID]: per-job counters read from the switches, then each host's congestion
        window, marks and resends in the last passing allreduce."""
        self._ctl("stats", *shlex.split(line))
        report_windows(self.last_windows)

    def do_loss(self, line: str) -> None:
        """loss NODE1 NODE2 PERCENT: random loss on that link, both directions."""
        words = shlex.split(line)
        try:
            a, b, percent = words[0], words[1], float(words[2])
            self.pnet.set_loss(a, b, percent)
            print(f"loss {a}<->{b}: {percent}%")
        except (IndexError, ValueError) as e:
            print(f"usage: loss NODE1 NODE2 PERCENT ({e})")


def _topology_path(arg: str) -> Path:
    """A file as given, else a shipped topology of that name (so an installed package runs
    without a checkout)."""
    path = Path(arg)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    return topology_file(arg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a PASSING topology in Mininet.")
    ap.add_argument("--topo", required=True,
                    help="topology file, or the name of a shipped one (star, leafspine)")
    ap.add_argument("--target", default="auto", help="auto, bmv2 or model (default auto)")
    ap.add_argument("--run-dir", default=None, help="logs, state (default runs/<topology>)")
    ap.add_argument("--window", type=int, default=None,
                    help="slots of the default job on each switch (default: "
                         + ", ".join(f"{w} on {t}" for t, w in DEFAULT_WINDOWS.items()) + ")")
    ap.add_argument("--pcap", action="store_true", help="BMv2: write pcaps to the run dir")
    ap.add_argument("--log", action="store_true",
                    help="switch logs per packet in the run dir (slow on BMv2)")
    ap.add_argument("--no-cli", action="store_true", help="set up, run one allreduce, stop")
    args = ap.parse_args(argv)
    try:
        topo_path = _topology_path(args.topo)
        topo = load(topo_path)
    except (TopologyError, FileNotFoundError) as e:
        print(f"run-topology: {e}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or f"runs/{topo.name}")
    setLogLevel("warning")
    pnet = PassingNetwork(topo, topo_path, args.target, run_dir, pcap=args.pcap,
                          log=args.log)
    print(f"*** target {pnet.target} ({pnet.target_reason}); logs and state in {run_dir}")
    try:
        pnet.start()
    except NetworkBusy as e:
        print(f"run-topology: {e}", file=sys.stderr)
        return 1
    try:
        params = pnet.create_job(1, window=args.window)
        print(f"*** job 1 over {', '.join(topo.hosts)}; agent parameters in {params}")
        pnet.ctl.disconnect()
        print(f"*** passing-ctl --config {pnet.config_file()} ... works from another shell")
        print(f"*** controller's job parameters for the hosts (management network): "
              f"{pnet.controller_url}/v1/jobs/<id>")
        if args.no_cli:
            return 0 if report_allreduce(*allreduce_measured(pnet, "64K")) else 1
        PassingCLI(pnet)
    finally:
        pnet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
