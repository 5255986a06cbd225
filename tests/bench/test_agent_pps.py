"""bench.agent_pps measures a correct stream: the echoed sums are checked inside main(), for the
in-memory sink and both UDP modes, and the report says which I/O ran."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import agent_pps
from passing import mmsg, packet
from passing import protocol as P


@pytest.mark.parametrize("argv,batched", [
    (["--sink", "memory"], True),
    (["--sink", "memory", "--per-pass", "3"], True),
    (["--sink", "udp", "--per-packet"], False),
    (["--sink", "udp"], mmsg.available()),
])
def test_each_sink_streams_the_tensor_back_exactly(argv, batched, capsys):
    assert agent_pps.main([*argv, "--size", "20K", "--slots", "32", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["batched"] is batched
    nfrag = -(-20 * 1024 // P.K)
    # Every fragment, plus resends if loopback lost any: the timed call repeats the warm-up's
    # size, so it speculates on its scale (no exponent packets) and, the echo returning each
    # fragment's own exponent, never misses.
    assert res["values"] == 20 * 1024 and res["packets"] >= nfrag


def test_the_memory_sink_hands_over_at_most_per_pass_results_in_order():
    sink = agent_pps.MemorySink(per_pass=4)
    rows = np.arange(10 * P.PAYLOAD_BYTES, dtype=np.uint32).astype(np.uint8).reshape(10, -1)
    sink.send_rows(rows[:6])
    sink.send_rows(rows[6:])
    got = [sink.recv_rows(0.1)[0] for _ in range(4)]
    assert [len(g) for g in got] == [4, 4, 2, 0]
    want = rows.copy()
    want[:, packet.FLAGS_OFFSET] = int(P.Flag.RESULT)
    assert np.array_equal(np.concatenate(got), want)


def test_a_wrong_sum_in_the_warm_up_call_is_reported(monkeypatch):
    """The warm-up call is checked like the timed ones: a sink that corrupts one value of the
    first value packet it answers makes the run fail, naming call 0."""
    class Corrupting(agent_pps.MemorySink):
        done = False

        def send_rows(self, rows):
            rows = rows.copy()
            recs = rows.view(packet.PAYLOAD_DTYPE).ravel()
            data = np.flatnonzero(np.any(recs["values"] != 0, axis=1))
            if not Corrupting.done and data.size:
                recs["values"][data[0], 0] += 1 << 20
                Corrupting.done = True
            super().send_rows(rows)

    monkeypatch.setattr(agent_pps, "MemorySink", Corrupting)
    with pytest.raises(SystemExit, match="call 0: wrong result"):
        agent_pps.main(["--sink", "memory", "--size", "20K", "--slots", "32"])
    assert Corrupting.done


def test_calls_must_be_at_least_one():
    with pytest.raises(SystemExit) as e:
        agent_pps.main(["--calls", "0"])
    assert e.value.code == 2
