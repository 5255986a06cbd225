"""bench.agent_pps measures a correct stream: the echoed sums are checked inside main(), for the
in-memory sink and both UDP modes, and the report says which I/O ran."""

from __future__ import annotations

import json

import pytest

from bench import agent_pps
from host_agent import mmsg
from passing import protocol as P


@pytest.mark.parametrize("argv,batched", [
    (["--sink", "memory"], True),
    (["--sink", "udp", "--per-packet"], False),
    (["--sink", "udp"], mmsg.available()),
])
def test_each_sink_streams_the_tensor_back_exactly(argv, batched, capsys):
    assert agent_pps.main([*argv, "--size", "20K", "--slots", "32", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["batched"] is batched
    nfrag = -(-20 * 1024 // P.K)
    # Every fragment and each slot's exponent packet, plus resends if loopback lost any.
    assert res["values"] == 20 * 1024 and res["packets"] >= nfrag + min(32, nfrag)
