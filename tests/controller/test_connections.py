"""The controller's switch sessions on their own (controller.connections.SwitchConnections):
one session per switch, kept until given up, and a switch that does not answer named with the
attempts made."""

from __future__ import annotations

import pytest

from controller.connections import Endpoint, SwitchConnections
from controller.errors import SwitchUnreachable
from tests.controller.conftest import ServedSwitches


def test_a_switch_that_never_answers_is_tried_with_backoff_then_named():
    waits: list[float] = []
    conns = SwitchConnections({"s1": Endpoint("s1", "127.0.0.1:1", 0)}, retries=3,
                              connect_timeout=0.2, sleep=waits.append)
    with pytest.raises(SwitchUnreachable, match=r"^switch s1: .* \(tried 3 times\)$"):
        conns.conn("s1")
    assert waits == [0.5, 1.0]
    assert conns.connected == []


def test_one_session_per_switch_until_given_up():
    served = ServedSwitches(["s1"])
    try:
        sw = served["s1"]
        conns = SwitchConnections({"s1": Endpoint("s1", sw.grpc_address, sw.device_id)})
        first = conns.conn("s1")
        assert conns.conn("s1") is first and conns.connected == ["s1"]
        conns.disconnect()
        assert conns.connected == []
        assert conns.conn("s1") is not first  # a new session, mastership taken again
        conns.disconnect()
    finally:
        served.close()
