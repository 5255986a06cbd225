"""The one window a job gets on all of its switches (slot indices are shared along the tree),
or the refusal that tells the operator what would fit."""

from __future__ import annotations

from collections.abc import Mapping

from controller.allocator import AllocationError, SlotAllocator


def common_window(job_id: int, window: int, min_window: int | None,
                  allocators: Mapping[str, SlotAllocator], resize: bool = False,
                  shrink: bool = False) -> int:
    """The window a job gets: one pool size on every one of its switches (slot indices are
    shared along the tree). `window` where every switch can give it, else, with `min_window`,
    the most all of them can give, down to `min_window`; anything less is refused with each
    switch's free ranges, the largest window that fits, and a --min-window hint only when that
    would succeed. resize: the window of the job's new pools in a `resize`, beside its
    current ones; shrink: a resize to a smaller window, which may take the reserve."""
    resizing = job_id if resize else None
    fits = min(a.largest_grant(resizing, shrink) for a in allocators.values())
    if window <= fits:
        return window
    if min_window is not None and min_window <= fits:
        return fits
    wanted = f"a window of {window} slots on each of its switches"
    if min_window is not None:
        wanted += f" (at least {min_window})"
    if fits:
        given = f"the largest window that fits on all of them now is {fits}"
    else:
        given = "no window fits on all of them now"
    per_switch = "; ".join(f"{name}: {a.grant_limit(resizing, shrink)}"
                           for name, a in allocators.items())
    if fits == 0:
        full = ", ".join(name for name, a in allocators.items()
                         if a.largest_grant(resizing, shrink) == 0)
        hint = f"delete a job on {full} first"
    elif min_window is None:
        hint = f"ask for a window of at most {fits}, or pass --min-window {fits} or less"
    else:
        hint = f"pass --min-window {fits} or less to accept a window of {fits}"
    if resize:
        head = (f"job {job_id} cannot be resized: its new pool, held beside its current one "
                f"until the hosts have moved, needs {wanted}")
    else:
        head = f"job {job_id} does not fit: it wants {wanted}"
    raise AllocationError(f"{head}, and {given} ({per_switch}); {hint}")
