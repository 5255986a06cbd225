"""The `passing` backend's start-up checks, without processes: torchrun's layout, the timeout
knob, and whether the torchrun nodes are exactly the job's hosts. Every failure must name what
is wrong and what to do; the torchrun tests (tests/host_agent/test_backend.py) check that the
same errors reach every rank."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import timedelta

import pytest

from host_agent.backend_checks import (
    PassingInitError,
    _check_layout,
    live_policy,
    params_digest,
    stream_options,
    torchrun_layout,
)
from passing.contract import HostParams, JobParams


def job(hosts: list[str]) -> JobParams:
    return JobParams(3, "passing", "", 48879, 61000, 8, tuple(
        HostParams(h, f"10.0.0.{i + 1}", "10.0.0.254", "02:00:00:00:00:01", i, 2)
        for i, h in enumerate(hosts)))


def reports(*nodes: tuple[int, str, int], params: JobParams | None = None) -> list[dict]:
    """One report per rank: (node, host, local ranks) per node, ranks in order, all holding
    the parameters of job(["h1", "h2"]) unless told."""
    digest = params_digest(params or job(["h1", "h2"]))
    return [{"node": n, "host": h, "local_size": size, "job": 3, "digest": digest}
            for n, h, size in nodes for _ in range(size)]


def test_layout_from_torchrun_environment():
    layout = torchrun_layout({"GROUP_RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    assert (layout.node, layout.local_rank, layout.local_size) == (1, 0, 2)


@pytest.mark.parametrize("env, says", [
    ({}, "GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE not set"),
    ({"GROUP_RANK": "0", "LOCAL_RANK": "0"}, "LOCAL_WORLD_SIZE not set"),
    ({"GROUP_RANK": "0", "LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"}, "not integers"),
    ({"GROUP_RANK": "0", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "not a valid layout"),
])
def test_layout_errors_name_the_variables(env, says):
    with pytest.raises(PassingInitError, match=says):
        torchrun_layout(env)


def test_a_late_host_is_waited_for_as_long_as_the_process_group_waits():
    # A host busy evaluating is late, not gone: the switch is given the group's timeout,
    # unless PASSING_TIMEOUT says otherwise.
    assert stream_options(timedelta(minutes=30), {}) == {"deadline": 1800.0}
    assert stream_options(timedelta(minutes=30), {"PASSING_TIMEOUT": "2.5"}) == \
        {"deadline": 2.5}
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(PassingInitError, match="PASSING_TIMEOUT"):
            stream_options(timedelta(minutes=30), {"PASSING_TIMEOUT": bad})


def test_quorum_options_come_from_the_environment():
    env = {"PASSING_PATIENCE": "0.05", "PASSING_STALENESS": "3"}
    assert stream_options(timedelta(seconds=60), env) == \
        {"deadline": 60.0, "patience": 0.05, "staleness": 3}
    for name, bad in (("PASSING_PATIENCE", "0"), ("PASSING_PATIENCE", "soon"),
                      ("PASSING_STALENESS", "-1"), ("PASSING_STALENESS", "two")):
        with pytest.raises(PassingInitError, match=name):
            stream_options(timedelta(seconds=60), {name: bad})
    # MIN..MAX: adaptive patience within those bounds.
    assert stream_options(timedelta(seconds=60), {"PASSING_PATIENCE": "0.01..0.2"}) == \
        {"deadline": 60.0, "patience": 0.2, "patience_min": 0.01}
    assert stream_options(timedelta(seconds=60), {"PASSING_PATIENCE": "0.1..0.1"})[
        "patience_min"] == 0.1
    for bad in ("0.2..0.01", "..0.1", "0.01..", "a..b", "0..0.1", "0.01..inf", "0.01...0.1"):
        with pytest.raises(PassingInitError, match="MIN..MAX"):
            stream_options(timedelta(seconds=60), {"PASSING_PATIENCE": bad})


def test_the_jobs_own_patience_and_staleness_apply_unless_the_environment_overrides():
    params = dataclasses.replace(job(["h1", "h2"]), patience=(0.01, 0.1), staleness=3)
    t = timedelta(seconds=60)
    assert stream_options(t, {}, params) == \
        {"deadline": 60.0, "patience": 0.1, "patience_min": 0.01, "staleness": 3}
    assert stream_options(t, {"PASSING_PATIENCE": "0.05"}, params) == \
        {"deadline": 60.0, "patience": 0.05, "staleness": 3}
    assert stream_options(t, {"PASSING_STALENESS": "0"}, params)["staleness"] == 0
    fixed = dataclasses.replace(params, patience=(0.2,))
    assert stream_options(t, {}, fixed) == {"deadline": 60.0, "patience": 0.2, "staleness": 3}
    # A job without patience: every round waits, whatever its staleness says.
    assert stream_options(t, {}, dataclasses.replace(params, patience=())) == \
        {"deadline": 60.0}


def test_a_live_policy_change_follows_the_same_rule_as_the_start():
    """What a rank changes to when `passing-ctl job set` changes the job's policy while it
    runs: the job's new patience and staleness, except what the environment sets."""
    params = dataclasses.replace(job(["h1", "h2"]), patience=(0.01, 0.1), staleness=3,
                                 policy=4)
    assert live_policy({})(params) == {"patience": 0.1, "patience_min": 0.01, "staleness": 3}
    assert live_policy({"PASSING_PATIENCE": "0.5"})(params) == \
        {"patience": 0.5, "patience_min": None, "staleness": 3}
    assert live_policy({"PASSING_STALENESS": "0"})(params)["staleness"] == 0
    # Back to bulk-synchronous: no patience, so no host asks to close a round.
    assert live_policy({})(dataclasses.replace(params, patience=()))["patience"] is None


def test_nodes_matching_the_hosts_give_each_node_its_ranks():
    nodes = _check_layout(job(["h1", "h2"]), reports((0, "h1", 2), (1, "h2", 2)))
    assert nodes == {0: [0, 1], 1: [2, 3]}
    # Node numbers need not follow the hosts' order.
    assert _check_layout(job(["h1", "h2"]), reports((0, "h2", 1), (1, "h1", 1))) == \
        {0: [0], 1: [1]}


@pytest.mark.parametrize("nodes, says", [
    (((0, "h1", 2),), "no node for h2 .*--nnodes 2"),
    (((0, "h1", 1), (1, "h1", 1)), "h1 is claimed by more than one torchrun node"),
    (((0, "h1", 1), (1, "h2", 1), (2, "h3", 1)), "nodes are h1, h2, h3"),
])
def test_nodes_that_are_not_the_jobs_hosts_are_refused(nodes, says):
    with pytest.raises(PassingInitError, match=says):
        _check_layout(job(["h1", "h2"]), reports(*nodes))


def test_ranks_holding_different_job_parameters_are_refused():
    mixed = reports((0, "h1", 2), (1, "h2", 2))
    other = JobParams.from_dict({**job(["h1", "h2"]).to_dict(), "window": 16})
    mixed[2]["digest"] = params_digest(other)
    with pytest.raises(PassingInitError, match="rank 2 .host h2. has job 3 with other param"):
        _check_layout(job(["h1", "h2"]), mixed)
    mixed[2]["job"] = 4
    with pytest.raises(PassingInitError, match="has job 4, others job 3"):
        _check_layout(job(["h1", "h2"]), mixed)


def test_ranks_closing_rounds_differently_are_refused():
    """PASSING_PATIENCE / PASSING_STALENESS must be the same on every rank: a rank that scaled
    short sums differently would drift from the others without an error."""
    same = reports((0, "h1", 2), (1, "h2", 2))
    for r in same:
        r.update(patience=0.05, staleness=2)
    assert _check_layout(job(["h1", "h2"]), same) == {0: [0, 1], 1: [2, 3]}
    # Also where they agree only by chance: one sets PASSING_PATIENCE=0.05, the other takes
    # the job's 0.05; a live change of the job's policy would part them.
    for key, value in (("patience", None), ("patience", [0.01, 0.05]), ("staleness", 1),
                       ("policy_env", [True, False])):
        mixed = [dict(r) for r in same]
        mixed[3][key] = value
        with pytest.raises(PassingInitError, match="rank 3 .host h2. has .*PASSING_PATIENCE|"
                                                   "PASSING_PATIENCE.*rank 3 .host h2."):
            _check_layout(job(["h1", "h2"]), mixed)


def test_ranks_of_one_node_naming_different_hosts_are_refused():
    bad = reports((0, "h1", 2), (1, "h2", 2))
    bad[1]["host"] = "h2"
    with pytest.raises(PassingInitError, match="node 0's ranks name different hosts"):
        _check_layout(job(["h1", "h2"]), bad)


def test_torch_knows_the_backend_after_import_torch_alone(tmp_path):
    # Registered by the torch.backends entry point (passing/_torch_autoload.py), as a user's script
    # that imports nothing of ours gets it; the backend itself is imported only when used.
    probe = ("import sys, torch, torch.distributed as dist; "
             "print('PASSING' in dist.Backend._plugins, 'host_agent.backend' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, check=True).stdout.split()
    assert out == ["True", "False"]
