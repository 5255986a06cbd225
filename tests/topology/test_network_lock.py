"""One PASSING network per machine (topologies/exclusive.py): a second is refused naming the
first, and a holder that died, however it died, never blocks a later start. Runs without root:
the lock file is the test's own."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from controller.topology import load
from tests import REPO
from topologies.exclusive import LOCK_ENV, NetworkBusy, NetworkLock
from topologies.network import PassingNetwork

_HOLD = """
import sys
from topologies.exclusive import NetworkLock
lock = NetworkLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes it, or kills this process
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock at tmp_path/net.lock; killed at the end."""
    path = tmp_path / "net.lock"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc, path
    finally:
        proc.kill()
        proc.wait(10)


def test_a_second_holder_is_refused_with_the_first_ones_pid(holder):
    proc, path = holder
    with pytest.raises(NetworkBusy, match=rf"pid {proc.pid}: .*-c") as err:
        NetworkLock(path).acquire()
    assert "make stop" in str(err.value)


def test_a_holder_killed_outright_leaves_nothing_that_blocks(holder):
    proc, path = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    lock = NetworkLock(path)
    lock.acquire()
    assert lock.held
    lock.release()
    lock.release()  # idempotent
    assert not lock.held
    again = NetworkLock(path)
    again.acquire()  # a released lock is free at once
    again.release()


def test_a_refused_network_touches_nothing_and_its_stop_does_nothing(holder, tmp_path,
                                                                    monkeypatch):
    """Refused before Mininet, the bridge or the controller exist; its stop() must not remove
    the running network's bridge (same name) either."""
    _, path = holder
    monkeypatch.setenv(LOCK_ENV, str(path))
    topo = REPO / "topologies" / "star.json"
    pnet = PassingNetwork(load(topo), topo, "model", tmp_path / "run")
    stopped = []
    monkeypatch.setattr(pnet.mgmt, "stop", lambda: stopped.append("mgmt"))
    with pytest.raises(NetworkBusy):
        pnet.start()
    pnet.stop()
    assert pnet.net is None and pnet.ctl is None and stopped == []
    assert not (tmp_path / "run").exists()
