"""Registers the `passing` torch.distributed backend when torch starts, so that an unchanged
script's `dist.init_process_group("passing")` finds it without importing anything of ours.

torch calls the functions named in the `torch.backends` entry-point group at the end of its own
import (set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to turn that off; `import host_agent` then registers
the backend). This module therefore stays cheap and can never break `import torch`: the backend
itself (host_agent.backend: numpy, the agent, the job source) is imported only when a process
group of it is created.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

BACKEND = "passing"


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
