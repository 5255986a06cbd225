"""What `make bench` measures: the scenarios (fabric, sizes, strategies) of the whole plan or
of a subset, how they group onto networks, and how many calls each run makes."""

from __future__ import annotations

from dataclasses import dataclass, field

from passing_agent import STRATEGIES
from passing_agent.workloads import DEFAULT_MODEL

KIB, MIB = 1 << 10, 1 << 20
LONG_CALL_S = 2.0  # calls predicted this long or longer are made once (call_plan)


@dataclass
class Scenario:
    """One fabric (topology, target, link bandwidth, GPUs per host) and what to run on it."""

    topo: str
    target: str
    bw_mbps: float | None  # every link shaped to this; 0: unshaped; None: as the file ships them
    gpus: int
    sizes: list[int]  # bytes
    strategies: list[str]
    host_counts: list[int] = field(default_factory=list)  # job sizes; empty: every host
    train_steps: int = 0
    iters: int = 2
    long_call_s: float = LONG_CALL_S  # see call_plan; 0: every run warms up and makes `iters`
    window: int | None = None  # slots per job and switch; None: the target's default
    train_model: str = DEFAULT_MODEL
    target_accuracy: float = 0.9  # time to this test accuracy, from the training curve


def scenarios(quick: bool, target: str) -> list[Scenario]:
    """What `make bench` measures. The shaped link bandwidths are chosen so that the links, not
    the CPUs of this 2-core machine, bound the model's runs (a 20 Mbit/s host link carries ~2.3k
    PASSING packets/s of 1 KiB of values); BMv2 aggregates a few thousand packets/s, so its
    links are shaped lower still. Beside them, on each target, the links as shipped: the regime
    a user runs."""
    every = list(STRATEGIES)
    # The digits MLP reaches its 90% test accuracy after ~120 steps with every strategy (the
    # sums are the same); 150 steps measure that time and the iterations/s with room to
    # spare, and took a quarter less of `make bench` than the 200 before.
    steps = 150
    if quick:
        return [Scenario("star", "model", 0, 2, [16 * KIB, 64 * KIB], every, [],
                         train_steps=20, iters=1)]
    runs = [
        # sizes, all strategies
        Scenario("leafspine", "model", 20, 2, [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB], every,
                 train_steps=steps),
        # the links as the topology ships them (100 Mbit/s): what a user of `make
        # run-topology` gets; on 2 cores the CPU, not these links, bounds PASSING there
        Scenario("leafspine", "model", None, 2, [MIB, 4 * MIB], every, train_steps=steps),
        # bandwidth
        Scenario("leafspine", "model", 10, 2, [MIB], every),
        Scenario("leafspine", "model", 50, 2, [MIB], every),
        # hosts: jobs of 2 and 3 hosts on the same fabric
        Scenario("leafspine", "model", 20, 2, [MIB], every, host_counts=[2, 3]),
        # GPUs per host (one host count, one size): in-host pre-aggregation's lever
        Scenario("leafspine", "model", 20, 1, [MIB], every),
        Scenario("leafspine", "model", 20, 4, [MIB], every),
    ]
    if target in ("auto", "bmv2") and _have_bmv2():
        runs += [
            # shaped low enough that BMv2's links, not its CPU, set the time
            Scenario("leafspine", "bmv2", 2, 2, [64 * KIB, 256 * KIB, MIB], every),
            # as shipped: `make run-topology TARGET=bmv2` and `allreduce 1M`, where BMv2's CPU
            # sets the time and PASSING does not win (issue 47's head-to-head, in every run)
            Scenario("leafspine", "bmv2", None, 2, [4 * MIB], every),
        ]
    return runs


def subset(topo: str, target: str, bws: list[float], gpus: list[int], sizes: list[int],
           strategies: list[str], host_counts: list[int], train_steps: int,
           iters: int, train_model: str = DEFAULT_MODEL,
           target_accuracy: float = 0.9) -> list[Scenario]:
    """The runs of a subset: one scenario per bandwidth and GPU count (bandwidth None: the
    links as the topology file ships them, 0: unshaped; GPUs 0: as the file gives them).
    Sizes are in bytes."""
    target = "model" if target == "auto" else target
    # GPU counts outermost: the bandwidths of one GPU count share a network (fabric_groups).
    return [Scenario(topo, target, bw, g, sizes, strategies, host_counts,
                     train_steps=train_steps, iters=iters, train_model=train_model,
                     target_accuracy=target_accuracy) for g in gpus for bw in bws]


def runs_in(plan: list[Scenario]) -> int:
    """How many measurements `plan` makes (each all-reduce size x strategy x job, and each
    training run): the N of the progress line."""
    return sum(max(1, len(sc.host_counts)) * (len(sc.sizes) + (1 if sc.train_steps else 0))
               * len(sc.strategies) for sc in plan)


def _have_bmv2() -> bool:
    from topologies.mininet_nodes import pick_target
    return pick_target("auto")[0] == "bmv2"


def fabric_groups(plan: list[Scenario]) -> list[list[Scenario]]:
    """The plan's scenarios in runs of consecutive ones that differ at most in link rate: each
    run shares one network, its links re-shaped between scenarios (topologies/link_rate.py),
    instead of a fresh one per rate (switches, and agents importing torch in every rank: ~20 s
    on 2 cores)."""
    groups: list[list[Scenario]] = []
    for sc in plan:
        if groups and _fabric(groups[-1][0]) == _fabric(sc):
            groups[-1].append(sc)
        else:
            groups.append([sc])
    return groups


def _fabric(sc: Scenario) -> tuple:
    # The window too: a job already made keeps its window (PassingNetwork.create_job).
    return sc.topo, sc.target, sc.gpus, sc.window


def call_plan(predicted_s: float, iters: int, long_call_s: float) -> tuple[int, int]:
    """(untimed warm-up calls, timed calls) of one run. A call the model predicts at
    `long_call_s` or more is made once, timed, without a warm-up: what a first call pays once
    (process groups are built before it, so it is the first round trips and buffers) is then a
    small share of it, and each further call would add that long again. Shorter calls: one
    warm-up, then `iters` timed calls. long_call_s 0: always the latter."""
    if long_call_s > 0 and predicted_s >= long_call_s:
        return 0, 1
    return 1, iters
