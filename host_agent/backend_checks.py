"""The `passing` backend's start-up checks: every rank's report of its torchrun layout, job,
host and PASSING_* environment, agreed over the store before any group is built, so that a
wrong job, host or layout fails `init_process_group` on every rank with the reason
(docs/pytorch.md, "Configuration"); and the stream options the environment sets."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from host_agent.job_source import params_from_env, pool_poll, this_host
from host_agent.overlap import overlap_enabled
from host_agent.pool_move import Policy
from host_agent.stream_api import StreamConfig
from passing.contract import JobParams, parse_patience


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
