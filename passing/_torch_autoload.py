"""Registers the `passing` torch.distributed backend when torch starts, so that an unchanged
script's `dist.init_process_group("passing")` finds it without importing anything of ours.

torch imports the modules named in the `torch.backends` entry-point group at the end of its own
import and calls them (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off; `import host_agent` then
registers the backend). An import error here would make `import torch` fail for every program
in the environment, so this module imports nothing of ours at import time and lives in the
`passing` package, not under a name as common as `host_agent` that a user's file could shadow;
the backend itself (host_agent.backend: numpy, the agent, the job source) is imported only when
a process group of it is created.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

from passing import BACKEND


def _create(store, rank: int, size: int, timeout: timedelta):
    from host_agent.backend import create_process_group
    return create_process_group(store, rank, size, timeout)


def register() -> None:
    """Make `init_process_group("passing")` known to torch (idempotent)."""
    try:
        import torch.distributed as dist
        if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
            return
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    except Exception as e:  # a broken registration must not take `import torch` down with it
        warnings.warn(f"PASSING: the {BACKEND!r} torch.distributed backend is not available: "
                      f"{type(e).__name__}: {e}", stacklevel=2)
