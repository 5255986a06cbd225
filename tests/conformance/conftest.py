"""The conformance suite: every test runs against each switch target (see tests/conftest.py),
programmed over real P4Runtime and fed real frames on veth interfaces."""

from __future__ import annotations

import pytest


@pytest.fixture
def star(fabric_of):
    """One switch s1 (device 0) with 5 test ports."""
    return fabric_of("star")


@pytest.fixture
def two_level(fabric_of):
    """tor1 (device 0) and tor2 (device 1): ports 1-2 hosts, port 3 up to the spine (device 2)
    ports 1 and 2; spine port 3 is a test port (unused by jobs)."""
    return fabric_of("two_level")


@pytest.fixture
def three_level(fabric_of):
    """tor1 (device 0), tor2 (1), tor3 (2): ports 1-2 hosts, port 3 up; spine1 (3): ports 1-2
    tor1 and tor2, port 3 up to the core; spine2 (4): port 1 tor3, port 2 up to the core;
    core (5): ports 1-2 the spines, port 3 a test port (unused by jobs)."""
    return fabric_of("three_level")
