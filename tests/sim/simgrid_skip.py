"""The skip every test that runs SimGrid takes when `import simgrid` fails (with the reason and
how to install it: python3-simgrid, which scripts/setup.sh installs)."""

import pytest

from sim import simgrid_missing

MISSING = simgrid_missing()
needs_simgrid = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
