"""The project as users install it: a wheel built from this checkout, installed into a fresh
virtualenv that cannot see the checkout, runs passing-ctl, passing-switch-model and
passing-agent (training included) from a directory outside it, with the P4 sources, the
committed P4Info and the topology files found inside the installed package.

Offline and quick: the wheel is built without build isolation (the setuptools this venv has),
and the fresh venv gets its dependencies through a .pth naming this venv's site-packages, so
nothing is downloaded or installed twice. That site-packages also holds the editable install's
finder, but a .pth names directories only: their own .pth files (the finder's hook) never run,
so the checkout stays out of reach."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from passing import protocol as P
from passing.p4info import sized_for_k
from testbed.loopback import UdpLoopbackSwitch
from tests.ports import free_port

CHECKOUT = Path(__file__).resolve().parents[2]
# What a wheel is built from: the sources, not this checkout's venv, builds or runs.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "runs", "dist", "__pycache__",
                                     "*.egg-info", ".pytest_cache", ".ruff_cache", ".hypothesis")



class Installed:
    """A venv with only the wheel of this project installed, and how to run its commands."""

    def __init__(self, venv: Path, cwd: Path):
        self.venv = venv
        self.cwd = cwd
        self.site = Path(subprocess.check_output(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()"
             "['purelib'])"], text=True).strip())
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["XDG_CACHE_HOME"] = str(cwd / "cache")  # where an installed package builds P4
        self.env = env

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def popen(self, *argv: str) -> subprocess.Popen:
        return subprocess.Popen(list(argv), cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def python(self, code: str) -> dict:
        res = self.run("python", "-c", code)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    tmp = tmp_path_factory.mktemp("install")
    src, dist, venv, work = tmp / "src", tmp / "dist", tmp / "venv", tmp / "work"
    shutil.copytree(CHECKOUT, src, ignore=NOT_SOURCES)
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                            "--no-build-isolation", "--disable-pip-version-check", "-w",
                            str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    (whl,) = dist.glob("passing-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    new_site = Path(subprocess.check_output(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()"
         "['purelib'])"], text=True).strip())
    # This venv's dependencies (numpy, torch, grpc, p4runtime, scikit-learn, ...), after the
    # new venv's own site-packages on sys.path, so the wheel's `passing` comes first.
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (new_site / "parent_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                              "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                              str(whl)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    work.mkdir()
    return Installed(venv, work)


def test_pipeline_files_resolve_inside_the_installed_package(installed):
    found = installed.python(
        "import json, sys, passing, passing.pipeline_files as pf\n"
        "print(json.dumps({'passing': passing.__file__, 'p4src': str(pf.P4SRC),\n"
        "  'p4info': str(pf.COMMITTED_P4INFO), 'p4info_exists': pf.COMMITTED_P4INFO.is_file(),\n"
        "  'sources': [str(p.relative_to(pf.P4SRC)) for p in pf.p4_sources()],\n"
        "  'tna': sorted(p.name for p in (pf.P4SRC / 'tna').glob('*.p4')),\n"
        "  'leafspine': str(pf.topology_file('leafspine')),\n"
        "  'checkout': str(pf.CHECKOUT), 'build': str(pf.BUILD_DIR),\n"
        "  'path': sys.path}))")
    site = str(installed.site)
    for key in ("passing", "p4src", "p4info", "leafspine"):
        assert found[key].startswith(site), (key, found[key])
    assert found["p4info_exists"]
    shipped = sorted(str(p.relative_to(CHECKOUT / "p4src"))
                     for p in [*(CHECKOUT / "p4src").glob("*.p4"),
                               *(CHECKOUT / "p4src").glob("include/*.p4")])
    assert sorted(found["sources"]) == shipped
    # The TNA program ships too: python -m passing.tna_build compiles it from a wheel.
    assert found["tna"] == sorted(p.name for p in (CHECKOUT / "p4src" / "tna").glob("*.p4"))
    # A wheel is no checkout: it builds P4 into the user's cache, not into site-packages.
    assert found["checkout"] == "None"
    assert found["build"] == str(installed.cwd / "cache" / "passing" / "build" / f"k{P.K}")
    assert not any(p == str(CHECKOUT) or p.startswith(f"{CHECKOUT}/passing") for p in
                   found["path"])


def test_the_compiled_window_and_switch_path_build_from_the_wheel(installed):
    """The C sources ship in the wheel and build into the user's cache, never into
    site-packages; the agent then takes the compiled window."""
    found = installed.python(
        "import json\nfrom host_agent import window_c\nfrom switch_model import fastpath\n"
        "print(json.dumps({'window': str(window_c.build()), 'fastpath': str(fastpath.build()),\n"
        "  'loaded': window_c.load() is not None}))")
    cache = str(installed.cwd / "cache" / "passing")
    assert found["window"].startswith(f"{cache}/window/"), found
    assert found["fastpath"].startswith(f"{cache}/fastpath/"), found
    assert found["loaded"]


def test_commands_import_no_test_harness(installed):
    # scapy and testbed/ are for tests and benchmarks: no installed command may need them.
    loaded = installed.python(
        "import json, sys, importlib.util\n"
        "import controller.cli, switch_model.cli, passing_agent.cli\n"
        "print(json.dumps({'scapy': 'scapy' in sys.modules,\n"
        "  'testbed': importlib.util.find_spec('testbed') is not None}))")
    assert loaded == {"scapy": False, "testbed": False}


def test_import_torch_registers_the_passing_backend_from_the_wheel(installed):
    # The torch.backends entry point: a user's script that imports nothing of ours can say
    # init_process_group("passing"); the backend's own modules load only when it is used.
    found = installed.python(
        "import json, sys, torch, torch.distributed as dist\n"
        "print(json.dumps({'registered': 'PASSING' in dist.Backend._plugins,\n"
        "  'autoload': sys.modules['passing._torch_autoload'].__file__,\n"
        "  'backend_loaded': 'host_agent.backend' in sys.modules}))")
    assert found["registered"] and not found["backend_loaded"]
    assert found["autoload"].startswith(str(installed.site)), found


def test_passing_ctl_help(installed):
    res = installed.run("passing-ctl", "--help")
    assert res.returncode == 0 and "usage: passing-ctl" in res.stdout, res.stderr
    res = installed.run("passing-agent", "--help")
    assert res.returncode == 0 and "--train STEPS" in res.stdout, res.stderr


def _wait_for_grpc(address: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with grpc.insecure_channel(address) as ch:
            try:
                grpc.channel_ready_future(ch).result(timeout=1)
                return
            except grpc.FutureTimeoutError:
                pass
    pytest.fail(f"no P4Runtime server at {address}")


def test_switch_models_serve_the_committed_p4info_and_passing_ctl_runs_a_job_on_them(installed):
    topo = installed.python("import json, passing.pipeline_files as pf; "
                            "print(json.dumps(str(pf.topology_file('leafspine'))))")
    switches = ["tor1", "tor2", "spine"]
    ports = {s: free_port() for s in switches}
    procs = {s: installed.popen("passing-switch-model", "--device-id", str(i),
                                "--grpc-server-addr", f"127.0.0.1:{ports[s]}")
             for i, s in enumerate(switches)}
    try:
        for s, p in procs.items():
            _wait_for_grpc(f"127.0.0.1:{ports[s]}", p)
        # Started with no --p4info: the P4Info the model runs is the one shipped in the wheel.
        committed = p4info_pb2.P4Info()
        text_format.Merge(Path(installed.python(
            "import json, passing.pipeline_files as pf; "
            "print(json.dumps(str(pf.COMMITTED_P4INFO)))")).read_text(), committed)
        committed = sized_for_k(committed)  # what p4c makes of it at this K (PASSING_K)
        with grpc.insecure_channel(f"127.0.0.1:{ports['tor1']}") as ch:
            got = p4runtime_pb2_grpc.P4RuntimeStub(ch).GetForwardingPipelineConfig(
                p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0), timeout=10)
        assert got.config.p4info == committed and len(committed.tables) > 0

        config = installed.cwd / "controller.json"
        config.write_text(json.dumps({
            "topology": topo, "state": "state.sqlite",
            "switches": {s: {"address": f"127.0.0.1:{ports[s]}", "device_id": i}
                         for i, s in enumerate(switches)}}))
        res = installed.run("passing-ctl", "--config", str(config), "job", "create", "7",
                            "--all-hosts", "--window", "32", "--json",
                            "--params-out", "job7.json")
        assert res.returncode == 0, res.stdout + res.stderr
        params = json.loads((installed.cwd / "job7.json").read_text())
        assert params["job_id"] == 7 and sorted(params["hosts"]) == ["h1", "h2", "h3", "h4"]
        res = installed.run("passing-ctl", "--config", str(config), "job", "list", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        (job,) = json.loads(res.stdout)
        assert job["job"] == 7 and sorted(job["switches"].split(",")) == sorted(switches), job
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    for s, p in procs.items():
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, f"{s}: exit {p.returncode}: {err[-1000:]}"


def test_passing_agent_trains_through_a_switch(installed, tmp_path):
    sw = UdpLoopbackSwitch(2, agent_udp_port=free_port(socket.SOCK_DGRAM), slots=32)
    try:
        params = tmp_path / "job.json"
        params.write_text(sw.agent_params(local_gpus=1).to_json())
        rendezvous = str(free_port())
        procs = [installed.popen("passing-agent", "--params", str(params), "--host", h,
                                 "--train", "5", "--rendezvous-port", rendezvous, "--json")
                 for h in ("h1", "h2")]
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        sw.close()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        res = json.loads(out)
        assert res["ok"] and res["steps"] == 5 and res["world"] == 2
        assert 0.0 <= res["accuracy"] <= 1.0 and res["packets"] > 0
