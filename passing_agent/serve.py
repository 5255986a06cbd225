"""`python -m passing_agent.serve`: passing-agent kept running on its host, driven by commands.

Each line on stdin is one command: a JSON list of passing-agent arguments, as on its command
line (`["--params", "job.json", "--host", "h1", "--size", "1M", "--strategy", "ring"]`). Each
gets exactly one JSON line on stdout: the report `passing-agent --json` would print, plus
`rank_starts` (how many times this agent started its local ranks), or, for arguments
passing-agent refuses, `{"ok": false, "usage": true, "error": ...}`. End of input, or the line
`quit`, stops it and its ranks. Anything that goes wrong is answered (`ok` false and an
`error`), so every command gets its line.

The local ranks start with the first command and stay up (passing_agent.pool): a command costs
its process groups and rendezvous, not G processes importing torch. `make bench`, the Mininet
CLI's `allreduce` and the tests drive them this way, one per host and command running at once
(topologies/agent_servers.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable

from passing_agent.cli import UsageError, parse_command
from passing_agent.pool import RankPool


def answer(line: str, pool: RankPool) -> dict:
    """The report for one command line (see the module's docstring). Whatever goes wrong is
    answered, never raised: the caller always gets exactly one line per command."""
    try:
        argv = json.loads(line)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise UsageError("a command is a JSON list of passing-agent arguments (strings)")
        params, host, opts, _ = parse_command(argv)
    except (ValueError, RecursionError) as e:  # UsageError and JSONDecodeError among them
        return {"ok": False, "usage": True, "error": str(e)}
    except SystemExit:  # --help: argparse printed it (to stderr here) and wants to exit
        return {"ok": False, "usage": True, "error": "--help is not a command"}
    try:
        res = pool.run(params, host, opts)
    except Exception as e:  # noqa: BLE001 - answered; the ranks are started afresh
        pool.stop()
        return {"ok": False, "error": f"the agent failed: {type(e).__name__}: {e}"}
    res["rank_starts"] = pool.starts
    return res


def serve(lines: Iterable[bytes], write: Callable[[str], None], pool: RankPool) -> None:
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
            continue
        if line == "quit":
            return
        write(json.dumps(answer(line, pool)))


def main() -> int:
    # The answers own stdout: everything else printed here or by the ranks (which inherit the
    # descriptors) goes to stderr, so no stray line is ever read as an answer.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # Before the ranks start (they import torch at once): torch's store logs every wait it
    # retries; the agent reports its own clear error.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    def write(text: str) -> None:
        answers.write(text + "\n")
        answers.flush()

    with RankPool() as pool:
        serve(sys.stdin.buffer, write, pool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
