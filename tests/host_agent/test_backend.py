"""The `passing` torch.distributed backend under torchrun: 2 hosts x 2 local ranks, each host a
torchrun node, summing through the switch model behind real UDP on loopback
(testbed.loopback.UdpLoopbackSwitch). No root needed; the Mininet version of the same is in
tests/integration/test_mininet.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.tables.job_admission import JobAdmissionTables
from passing import protocol as P
from testbed.loopback import InProcessConnection, UdpLoopbackSwitch
from tests import REPO
from tests.ports import free_port

HOSTS, LOCAL = 2, 2
WORKER = Path(__file__).with_name("backend_worker.py")
# bfloat16 keeps 8 bits of mantissa: values up to ~64 are exact to 0.25, sums of four to 1.
TOLERANCE = {"torch.float32": 1e-3, "torch.float16": 0.05, "torch.bfloat16": 1.0}



@pytest.fixture
def switch(request):
    quorum = getattr(request, "param", 0)  # indirect parametrization: the job's quorum
    sw = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=16,
                           quorum=quorum)
    yield sw
    sw.close()


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def native_stacks(pids: list[int]) -> str:
    """Every thread's stack of each of `pids`, C++ frames included (gdb), where gdb is here."""
    if shutil.which("gdb") is None:
        return "no stacks: gdb is not installed\n"
    out = []
    for pid in pids:
        try:
            res = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt 25"],
                                 capture_output=True, text=True, timeout=60)
            text = res.stdout
        except (subprocess.TimeoutExpired, OSError) as e:
            text = f"gdb failed: {e}"
        # Only the frames: gdb's symbol-loading chatter is most of its output.
        frames = [line[:240] for line in text.splitlines() if line.startswith(("Thread ", "#"))]
        out.append(f"== pid {pid}\n" + "\n".join(frames))
    return "\n".join(out) + "\n"


class Run:
    """Both torchrun nodes of one run, each in its own process group (so that the test can
    kill one node whole), killed whatever happens."""

    def __init__(self, tmp: Path, scenario: str, params_files: list[Path], hosts: list[str],
                 extra_env: dict[str, str]):
        self.out = tmp / "out"
        self.out.mkdir()
        port = free_port()
        self.procs: list[subprocess.Popen] = []
        for node, host in enumerate(hosts):
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("PASSING_")},
                   "PYTHONPATH": str(REPO), "OUT_DIR": str(self.out), "SCENARIO": scenario,
                   "PASSING_PARAMS": str(params_files[node]), "PASSING_HOST": host,
                   "OMP_NUM_THREADS": "1", **extra_env}
            log = open(tmp / f"node{node}.log", "w")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
                 "--nproc-per-node", str(LOCAL), "--node-rank", str(node),
                 "--master-addr", "127.0.0.1", "--master-port", str(port),
                 "--max-restarts", "0", str(WORKER)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=tmp))

    def wait(self, timeout: float) -> list[int | None]:
        """Exit codes (None: still running at the deadline, then killed). A run still going at
        the deadline first has every process's threads' stacks written to stacks.txt beside
        the nodes' logs (logs() shows them): a rare hang is diagnosed from the run that hit it."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        if None in codes:
            pids = [pid for p in self.procs if p.poll() is None for pid in descendants(p.pid)]
            for r in range(HOSTS * LOCAL):  # the ranks that can print their Python stacks do
                pid = self.read(r, "pid")
                if pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
            time.sleep(1)
            (self.out.parent / "stacks.txt").write_text(native_stacks(pids))
        self.kill()
        return codes

    def kill_node(self, node: int) -> None:
        """SIGKILL to the node's torchrun and every process under it, as a node that fails
        leaves them (torchrun starts its workers in sessions of their own)."""
        p = self.procs[node]
        if p.poll() is not None:  # exited: its pid may be another process's by now
            return
        for pid in [*descendants(p.pid), p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def kill(self) -> None:
        for node in range(len(self.procs)):
            self.kill_node(node)

    def read(self, rank: int, name: str):
        path = self.out / f"rank{rank}.{name}.json"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def launch(tmp_path, switch):
    runs: list[Run] = []

    def start(scenario: str, hosts: list[str] | None = None, params: dict | None = None,
              node1_params: dict | None = None, timeout: str | None = "5",
              env: dict[str, str] | None = None) -> Run:
        """timeout: PASSING_TIMEOUT (None: unset, the process group's timeout applies)."""
        files = [tmp_path / "job.json", tmp_path / "job-node1.json"]
        files[0].write_text(json.dumps(params or switch.agent_params(LOCAL).to_dict()))
        files[1].write_text(node1_params and json.dumps(node1_params) or files[0].read_text())
        extra = {"PASSING_TIMEOUT": timeout} if timeout is not None else {}
        run = Run(tmp_path, scenario, files, hosts or ["h1", "h2"], {**extra, **(env or {})})
        runs.append(run)
        return run
    yield start
    for run in runs:
        run.kill()


def logs(tmp: Path) -> str:
    text = "\n".join(p.read_text()[-3000:] for p in sorted(tmp.glob("node*.log")))
    stacks = tmp / "stacks.txt"
    if stacks.exists():  # a hang: where every thread was (the gloo and c10d frames matter)
        lines = [line for line in stacks.read_text().splitlines()
                 if line.startswith(("==", "Thread ")) or any(
                     k in line for k in ("gloo", "c10d", "wait", "Py_", "pthread_cond"))]
        text += "\n-- stacks at the deadline --\n" + "\n".join(lines)[-12000:]
    return text


def test_collectives_through_the_switch_and_delegated(launch, switch, tmp_path):
    run = launch("collectives")
    assert run.wait(240) == [0, 0], logs(tmp_path)
    world = HOSTS * LOCAL
    results = [run.read(r, "result") for r in range(world)]
    assert all(results), [run.read(r, "error") for r in range(world)]
    for rank, res in enumerate(results):
        assert res["backend"] == "passing"
        for dtype, tol in TOLERANCE.items():
            for op in ("SUM", "AVG"):
                got = res[f"allreduce_{op}_{dtype}"]
                assert got["dtype_kept"] and got["max_error"] <= tol, (rank, op, dtype, got)
        for name in ("allreduce_MAX", "allreduce_MIN", "allreduce_PRODUCT", "allreduce_int64",
                     "allreduce_float64", "broadcast", "all_gather", "all_gather_into_tensor",
                     "reduce_scatter_tensor", "reduce", "all_to_all_single",
                     "all_gather_object", "send_recv", "barrier"):
            assert res[name]["passing"] == res[name]["gloo"], (rank, name, res[name])
        if rank < 2:
            assert res["subgroup_sum"] == [3.0, 3.0, 3.0]
        assert run.read(rank, "gloo_threads_left") == [], rank
    # Each SUM/AVG call went through the switch: its host's leader sent at least one packet
    # per K values for it; nothing delegated did; the other local ranks send nothing.
    for rank in (0, 2):
        for dtype in TOLERANCE:
            for op in ("SUM", "AVG"):
                assert results[rank][f"packets_{op}_{dtype}"] >= -(-1000 // P.K), (rank, dtype)
        assert results[rank]["delegated_packets"] == 0
    assert all(v is None for k, v in results[1].items() if k.startswith("packets_"))
    assert switch.delivered >= 2 * 6 * -(-1000 // P.K)


def test_ddp_on_passing_equals_ddp_on_gloo(launch, tmp_path):
    run = launch("ddp")
    assert run.wait(240) == [0, 0], logs(tmp_path)
    weights = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(weights), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    # DDP's buckets went through the switch with backend passing, not with the gloo group.
    for rank in (0, 2):
        through_switch, with_gloo = weights[rank]["packets"]
        assert through_switch >= 6 and with_gloo == 0, (rank, weights[rank]["packets"])
    for rank, w in enumerate(weights):
        ours, ref = w["passing"], w["gloo"]
        assert len(ours) == len(ref)
        assert max(abs(a - b) for a, b in zip(ours, ref, strict=True)) < 1e-3, rank
        # every rank holds the same model, bit for bit
        assert ours == weights[0]["passing"]


def test_ddp_trains_while_its_job_waits_for_switch_slots(launch, switch, tmp_path):
    """A job created waiting for slots (window 0, no job_config on its switch): the backend
    builds the leaders' group, DDP's buckets are summed by the host collective, nothing goes
    to the switch, and the weights are gloo's on every rank."""
    conn = InProcessConnection(switch.service)
    conn.write([JobAdmissionTables(conn).job_delete(switch.entries.job.job_id, 0)])
    waiting = dataclasses.replace(switch.agent_params(LOCAL), window=0)
    run = launch("ddp", params=waiting.to_dict())
    assert run.wait(240) == [0, 0], logs(tmp_path)
    weights = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(weights), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    for rank in (0, 2):
        assert weights[rank]["packets"] == [0, 0], weights[rank]["packets"]
        assert weights[rank]["host_calls"] >= 6, weights[rank]
    for rank, w in enumerate(weights):
        assert max(abs(a - b) for a, b in zip(w["passing"], w["gloo"], strict=True)) < 1e-3
        assert w["passing"] == weights[0]["passing"], rank  # one model, bit for bit
    assert switch.delivered == 0


def test_async_all_reduces_run_in_the_background_and_complete_in_order(launch, tmp_path):
    run = launch("overlap")
    assert run.wait(240) == [0, 0], logs(tmp_path)
    results = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(results), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    for rank, res in enumerate(results):
        assert res["right"] == [True] * 5, (rank, res)  # the four, and the one before barrier
        assert res["order"] == [0, 1, 2, 3], (rank, res)
        # The calls returned before their sums were done: the last, queued behind three of
        # 800 KB through the switch, certainly; all four well before the last completed.
        assert res["pending_at_return"][-1], (rank, res)
        assert res["returned_s"] < res["waited_s"] / 2, (rank, res)
        assert res["done_by_barrier"], rank


def test_ddp_without_overlap_gives_the_same_weights(launch, tmp_path):
    """PASSING_OVERLAP=0 (every sum in the caller's thread) trains the same model as the
    default, in the background: compared through gloo's, which both must equal."""
    run = launch("ddp", env={"PASSING_OVERLAP": "0"})
    assert run.wait(240) == [0, 0], logs(tmp_path)
    weights = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(weights), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    for w in weights:
        assert max(abs(a - b) for a, b in zip(w["passing"], w["gloo"], strict=True)) < 1e-3
        assert w["passing"] == weights[0]["passing"]


def test_what_gloo_users_rely_on(launch, tmp_path):
    run = launch("semantics")
    assert run.wait(240) == [0, 0], logs(tmp_path)
    world = HOSTS * LOCAL
    for rank in range(world):
        res = run.read(rank, "result")
        assert res is not None, run.read(rank, "error")
        # autograd: the summed loss's gradient is this rank's own, as with gloo
        assert res["loss_grad"]["passing"] == pytest.approx(res["loss_grad"]["gloo"]), rank
        assert res["parameter"] == [float(sum(range(world)))] * 4
        # AVG divides before rounding to float16: 30000 stays 30000, no overflow to inf
        assert res["fp16_avg"] == [30000.0] * 8
        # a strided view: its elements summed, the elements between them untouched
        base = [float(i * (rank + 1)) for i in range(20)]
        total = sum(r + 1 for r in range(world))
        assert res["view"][1::2] == base[1::2]
        assert res["view"][::2] == [float(i * total) for i in range(0, 20, 2)]
        # Inf on one rank: NaN everywhere on every rank (GradScaler skips the step), no error,
        # and the next call is exact again
        assert all(res["nonfinite"]), rank
        assert res["after_nonfinite"] == [float(sum(range(world)))] * 100
        # destroy_process_group stopped every gloo thread of the process, the in-host group's
        # too, on the leaders that met the Inf as well: a gloo thread left to interpreter exit
        # can abort a finished run (SIGABRT, "terminate called without an active exception")
        assert run.read(rank, "gloo_threads_left") == [], rank


def test_a_destroyed_group_releases_what_it_held(launch, tmp_path):
    """destroy_process_group frees the leader's UDP port and the in-host group: a second
    init_process_group("passing") in the same processes sums correctly, and every rank exits 0
    (a gloo group left to interpreter finalization can abort a finished run). The destroyed
    group, still held, refuses to sum."""
    run = launch("reinit")
    assert run.wait(240) == [0, 0], logs(tmp_path)
    world = HOSTS * LOCAL
    for rank in range(world):
        res = run.read(rank, "result")
        assert res is not None, run.read(rank, "error")
        assert res[:2] == [[float(sum(range(world)))],
                           [float(sum(r + 10 for r in range(world)))]], rank
        assert "destroy_process_group destroyed" in res[2], res[2]


@pytest.mark.parametrize("switch", [1], indirect=True)
def test_a_straggling_node_is_left_out_by_a_quorum_every_other_call(launch, tmp_path):
    """Quorum 1 of 2 hosts, PASSING_PATIENCE 50 ms, staleness 1; node 1 is 1 s late for each
    of 3 AVG all-reduces: calls 1 and 3 close without it, and every rank (the late ones too)
    gets the mean of node 0's ranks (1 and 2: 1.5), scaled from the sum that made it; call 2
    follows a short call, so it waits: the mean of all four (2.5)."""
    run = launch("straggler", env={"PASSING_PATIENCE": "0.05", "PASSING_STALENESS": "1"})
    assert run.wait(240) == [0, 0], logs(tmp_path)
    results = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(results), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    assert all(r == results[0] for r in results), results  # every replica the same
    first, second, third = results[0]
    assert second == [2.5]
    for call in (first, third):
        assert set(call) <= {1.5, 2.5} and 1.5 in call, results[0]


@pytest.mark.parametrize("switch", [1], indirect=True)
def test_a_node_behind_by_whole_calls_takes_them_without_computing(launch, tmp_path):
    """Quorum 1 of 2, staleness 5: node 0 makes three AVG calls (of 1+2, times the call's
    number) while node 1 sleeps. calls_behind tells node 1's ranks 3; their three calls of
    zeros return node 0's means (1.5, 3.0, 4.5, scaled from node 0's two GPUs), the same on
    every rank; in a fourth call node 0 is the late one (3 s), and every rank gets node 1's
    mean ((3 + 4) * 4 / 2 = 14.0)."""
    run = launch("behind", env={"PASSING_PATIENCE": "0.05", "PASSING_STALENESS": "5"})
    assert run.wait(240) == [0, 0], logs(tmp_path)
    results = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(results), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    for rank, res in enumerate(results):
        assert res["behind"] == (3 if rank >= LOCAL else 0), (rank, res)
        assert res["results"] == [[1.5], [3.0], [4.5], [14.0]], (rank, res)
        assert res["after"] == 0, (rank, res)


@pytest.mark.parametrize("switch", [1], indirect=True)
def test_a_slow_node_skips_the_steps_the_other_completed_and_stays_identical(launch,
                                                                             tmp_path):
    """bench/straggler_train.py's loop, 30 steps: node 1 computes 4x as long as node 0
    (30 ms against 120 ms a step), quorum 1 of 2, patience 10 ms, staleness 3. Node 1
    abandons steps node 0 completed without it and takes their results, and every rank ends
    with the same weights, having learned (test accuracy far above chance)."""
    args = ("--backend passing --steps 30 --compute-ms 30 --slow-node 1 --slow-factor 4 "
            "--catch-up --check-ms 5 --eval-every 10")
    run = launch("train_straggler", env={"PASSING_PATIENCE": "0.01", "PASSING_STALENESS": "3",
                                          "TRAIN_ARGS": args})
    assert run.wait(240) == [0, 0], logs(tmp_path)
    reports = [run.read(r, "result") for r in range(HOSTS * LOCAL)]
    assert all(reports), [run.read(r, "error") for r in range(HOSTS * LOCAL)]
    assert len({r["param_checksum"] for r in reports}) == 1, reports
    assert all(r["ok"] and r["steps"] == 30 and r["accuracy"] > 0.5 for r in reports)
    assert all(r["accuracy"] == reports[0]["accuracy"] for r in reports)
    for r in reports:
        assert (r["skipped"] > 0) == (r["node"] == 1), r
    leaders = [r for r in reports if "short_calls" in r]
    assert len(leaders) == HOSTS and all(r["short_calls"] > 0 for r in leaders)


def test_a_late_rank_is_waited_for_as_gloo_waits(launch, tmp_path):
    # No PASSING_TIMEOUT: the switch is given the process group's timeout, and rank 0 comes
    # 8 s late (longer than the stream's own default of 10 s would allow after a few resends).
    run = launch("slow", timeout=None)
    assert run.wait(180) == [0, 0], logs(tmp_path)
    for rank in range(HOSTS * LOCAL):
        assert run.read(rank, "result") == [float(sum(range(HOSTS * LOCAL)))] * 10


def test_a_killed_node_gives_the_others_an_error_not_a_hang(launch, tmp_path):
    run = launch("die", env={"PYTHONFAULTHANDLER": "1"})
    deadline = time.monotonic() + 120
    while not (run.read(2, "training") and run.read(0, "training")):
        assert time.monotonic() < deadline, logs(tmp_path)
        assert all(p.poll() is None for p in run.procs), logs(tmp_path)
        time.sleep(0.2)
    killed_at = time.monotonic()
    run.kill_node(1)
    codes = run.wait(60)
    assert codes[0] not in (0, None), logs(tmp_path)  # node 0 failed, on its own, in time
    assert time.monotonic() - killed_at < 60
    for rank in (0, 1):
        err = run.read(rank, "error")
        assert err is not None, logs(tmp_path)
        assert err["type"] == "AllreduceError" or "AllreduceError" in err["traceback"], err


@pytest.mark.parametrize("case", ["host not in job", "job of another mode", "too few nodes",
                                  "nodes holding different jobs"])
def test_a_wrong_job_or_host_fails_at_init_on_every_rank(launch, switch, tmp_path, case):
    params = switch.agent_params(LOCAL).to_dict()
    hosts = ["h1", "h2"]
    if case == "host not in job":
        hosts = ["h1", "h9"]
        expect = "h9"
    elif case == "job of another mode":
        ina = UdpLoopbackSwitch(HOSTS, agent_udp_port=free_port(socket.SOCK_DGRAM), ranks=2)
        params = ina.agent_params().to_dict()
        ina.close()
        expect = "mode passing"
    elif case == "too few nodes":
        params["hosts"]["h3"] = {**params["hosts"]["h2"], "host_ip": "127.0.0.13",
                                 "contributor_id": 2}
        expect = "no node for h3"
    node1_params = None
    if case == "nodes holding different jobs":
        node1_params = {**params, "job_id": 2}
        expect = "the ranks do not hold the same job parameters"
    start = time.monotonic()
    run = launch("collectives", hosts=hosts, params=params, node1_params=node1_params)
    codes = run.wait(120)
    assert all(c not in (0, None) for c in codes), logs(tmp_path)
    assert time.monotonic() - start < 90
    for rank in range(HOSTS * LOCAL):
        err = run.read(rank, "error")
        assert err is not None and err["type"] == "PassingInitError", (rank, err)
        assert expect in err["message"], (rank, err["message"])
