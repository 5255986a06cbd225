"""The Mininet links' shaping (topologies/mininet_nodes.QuietTCIntf): Mininet's own htb commands
with the class's quantum set, so that tc has nothing to warn about (Mininet prints any tc output
as an error) and a link re-shaped live (topologies/link_rate.set_rate) gets the same class."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("mininet", reason="Mininet (Debian's python3-mininet) is not installed")

from mininet.link import TCIntf  # noqa: E402

from topologies import link_rate  # noqa: E402
from topologies.mininet_nodes import QuietTCIntf  # noqa: E402


def commands(cls, **params):
    intf = cls.__new__(cls)  # bwCmds reads nothing of a built interface but its node's name
    intf.node = SimpleNamespace(name="h1")
    return intf.bwCmds(**params)


@pytest.mark.parametrize("bw", [2, 20, 100, 1000])
def test_the_htb_class_is_mininets_with_the_quantum_set(bw):
    mine, parent = commands(QuietTCIntf, bw=bw)
    theirs, their_parent = commands(TCIntf, bw=bw)
    assert parent == their_parent and len(mine) == len(theirs)
    changed = [(a, b) for a, b in zip(mine, theirs, strict=True) if a != b]
    assert changed == [(theirs[1] + f" quantum {link_rate.HTB_QUANTUM}", theirs[1])]
    assert mine[1].endswith("htb " + link_rate.htb_class_options(bw))


def test_other_shapings_and_no_shaping_are_mininets():
    for params in ({}, {"bw": 10, "use_tbf": True}, {"bw": 10, "use_hfsc": True}):
        assert commands(QuietTCIntf, **params) == commands(TCIntf, **params), params
