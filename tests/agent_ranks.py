"""Test helper: the local ranks of a running passing-agent, found through /proc."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The processes `pid` started that still run (none if it is gone)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def rank_processes(agent: int) -> list[int]:
    """The agent's local ranks, oldest first: the children of its fork server (passing_agent.pool
    forks them there); its other child, multiprocessing's resource tracker, has none."""
    return sorted(rank for child in children(agent) for rank in children(child))


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, the fork server and the resource tracker included."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found
