"""Compile the P4 program with p4c's BMv2 back end: passing.json (what simple_switch_grpc runs)
and passing.p4info.txtpb, in a build directory. `make build`, the topology runner and the tests
call it; like make, it compiles only when a P4 source is newer than the build.

    python -m passing.p4build [--out DIR] [--p4c p4c-bm2-ss] [--force]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from passing.pipeline_files import BUILD_DIR, P4_MAIN, p4_sources

P4C = "p4c-bm2-ss"


class P4cMissing(RuntimeError):
    """p4c is not installed: no package registry carries it."""


def p4c_missing_message(p4c: str) -> str:
    return (f"cannot build the P4 program: '{p4c}' (the p4c BMv2 backend) is not on PATH.\n"
            "  p4c is in no package registry; use the p4lang Docker images (docker/) or build p4c\n"
            "  from source, then run 'make build' (or 'python -m passing.p4build') again, or\n"
            "  name it: 'make build P4C=/path/to/p4c-bm2-ss'.")


def up_to_date(out: Path) -> bool:
    """Both outputs exist and are newer than every P4 source."""
    outputs = [out / "passing.json", out / "passing.p4info.txtpb"]
    if not all(p.exists() for p in outputs):
        return False
    built = min(p.stat().st_mtime for p in outputs)
    return all(src.stat().st_mtime <= built for src in p4_sources())


def build(out: Path = BUILD_DIR, p4c: str = P4C, force: bool = False) -> bool:
    """Compile into `out` unless it is up to date (or `force`); True when it compiled.

    Raises P4cMissing without p4c, subprocess.CalledProcessError when p4c rejects the program
    (its own messages are on stderr)."""
    out = Path(out)
    if not force and up_to_date(out):
        return False
    if shutil.which(p4c) is None:
        raise P4cMissing(p4c_missing_message(p4c))
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([p4c, "--arch", "v1model", "--std", "p4-16", "-o", str(out / "passing.json"),
                    "--p4runtime-files", str(out / "passing.p4info.txtpb"), str(P4_MAIN)],
                   check=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m passing.p4build",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=BUILD_DIR,
                    help=f"build directory (default {BUILD_DIR})")
    ap.add_argument("--p4c", default=P4C, help=f"p4c's BMv2 back end (default {P4C})")
    ap.add_argument("--force", action="store_true", help="compile even when up to date")
    args = ap.parse_args(argv)
    try:
        built = build(args.out, args.p4c, args.force)
    except P4cMissing as e:
        # On stdout, as `make build` has always printed it.
        print(e)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"p4build: {args.p4c} failed (exit {e.returncode})", file=sys.stderr)
        return 1
    if built:
        print(f"built {args.out / 'passing.json'} and {args.out / 'passing.p4info.txtpb'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
