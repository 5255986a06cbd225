"""A simulator of PASSING and its baselines on SimGrid (issue 45).

Large fabrics cannot be emulated on two cores, so this package describes them to SimGrid
(Debian's python3-simgrid, SimGrid 3.32) and lets SimGrid's flow model do the bandwidth sharing
and the clock: nothing here advances time itself. The modules, one job each:

* `fabric`: the project's topology files (controller.topology) reshaped, and generated
  leaf-spine fabrics of any size;
* `wire`: bytes on the wire per strategy (PASSING frames from passing.protocol, TCP framing);
* `costs`: the host, switch and in-host costs of the two regimes simulated (the 2-core
  emulation that `make bench` measures, and a datacenter);
* `platform`: the SimGrid platform built from a Topology;
* `jobs`: the aggregation tree of a job, from the controller's own plan;
* `actors`, `switch`, `collectives`, `strategies`: the strategies as SimGrid actors, at
  chunk (slot-window) granularity;
* `runner`: one simulation per process (SimGrid's engine is once per process);
* `measured`, `validate`, `study`, `plots`, `report`, `cli`: what `python -m sim` does.

SimGrid is imported only inside the simulation processes (sim.runner), so the rest of the
package, and the tests' skip, work without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

INSTALL_HINT = "apt-get install -y python3-simgrid (Debian 12: SimGrid 3.32)"


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """SimGrid's Python module logs a configuration line on stderr when imported; hide it."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def import_simgrid() -> Any:
    """The simgrid module (ImportError when it is not installed)."""
    with _quiet_stderr():
        import simgrid
    return simgrid


def simgrid_missing() -> str | None:
    """Why the simulator cannot run here, or None when `import simgrid` works."""
    try:
        import_simgrid()
    except ImportError as e:
        return f"import simgrid failed ({e}); install it with: {INSTALL_HINT}"
    return None
