"""Compile the P4 program with p4c's BMv2 back end: passing.json (what simple_switch_grpc runs)
and passing.p4info.txtpb, in a build directory. `make build`, the topology runner and the tests
call it; like make, it compiles only when a P4 source is newer than the build, or the build is
for another K.

The program is compiled for this process's K (passing.protocol.K, from PASSING_K) by passing
-DPASSING_K=<K> to p4c, and the K is recorded next to the outputs (passing.k), so a build is
never used with another K. By default each K builds into its own directory, BUILD_ROOT/k<K>.

    python -m passing.p4build [--out DIR | --root DIR] [--p4c p4c-bm2-ss] [--force]
                              [--update-p4info]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from passing import protocol as P
from passing.pipeline_files import (
    BUILD_DIR,
    BUILD_ROOT,
    COMMITTED_P4INFO,
    K_STAMP,
    P4_MAIN,
    built_k,
    newer_source,
)

P4C = "p4c-bm2-ss"


class P4cMissing(RuntimeError):
    """p4c is not installed: no package registry carries it."""


def p4c_missing_message(p4c: str) -> str:
    return (f"cannot build the P4 program: '{p4c}' (the p4c BMv2 backend) is not on PATH.\n"
            "  p4c is in no package registry; use the p4lang Docker images (docker/) or build p4c\n"
            "  from source, then run 'make build' (or 'python -m passing.p4build') again, or\n"
            "  name it: 'make build P4C=/path/to/p4c-bm2-ss'.")


def up_to_date(out: Path) -> bool:
    """Both outputs exist, were built for this K and are newer than every P4 source."""
    outputs = [out / "passing.json", out / "passing.p4info.txtpb"]
    if not all(p.exists() for p in outputs) or built_k(out) != P.K:
        return False
    return newer_source(out) is None


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
    # Whatever happens below, the outputs no longer belong to the K recorded before.
    (out / K_STAMP).unlink(missing_ok=True)
    subprocess.run([p4c, "--arch", "v1model", "--std", "p4-16", f"-DPASSING_K={P.K}",
                    "-o", str(out / "passing.json"),
                    "--p4runtime-files", str(out / "passing.p4info.txtpb"), str(P4_MAIN)],
                   check=True)
    (out / K_STAMP).write_text(f"{P.K}\n")
    return True


def update_committed_p4info(out: Path) -> None:
    """Copy the build's P4Info over the committed one (after changing p4src/). The committed
    P4Info is the one of DEFAULT_K (other K differ only in a register size, see
    passing.p4info.sized_for_k), so it is refused at any other K."""
    if P.K != P.DEFAULT_K:
        raise P.KError(f"the committed P4Info is built for the default K={P.DEFAULT_K}; unset "
                       f"{P.K_ENV} (now K={P.K}) to update it")
    shutil.copyfile(out / "passing.p4info.txtpb", COMMITTED_P4INFO)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m passing.p4build",
                                 description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None,
                       help=f"build directory (default {BUILD_DIR}, from {P.K_ENV})")
    where.add_argument("--root", type=Path, default=None,
                       help=f"build into ROOT/k<K> (as the default does under {BUILD_ROOT})")
    ap.add_argument("--p4c", default=P4C, help=f"p4c's BMv2 back end (default {P4C})")
    ap.add_argument("--force", action="store_true", help="compile even when up to date")
    ap.add_argument("--update-p4info", action="store_true",
                    help="then copy the P4Info to p4src/ (after changing p4src/; default K only)")
    args = ap.parse_args(argv)
    out = args.out or (args.root / f"k{P.K}" if args.root else BUILD_DIR)
    try:
        built = build(out, args.p4c, args.force)
    except P4cMissing as e:
        # On stdout, as `make build` has always printed it.
        print(e)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"p4build: {args.p4c} failed (exit {e.returncode})", file=sys.stderr)
        return 1
    if built:
        print(f"built {out / 'passing.json'} and {out / 'passing.p4info.txtpb'} for K={P.K}")
    if args.update_p4info:
        try:
            update_committed_p4info(out)
        except P.KError as e:
            print(f"p4build: {e}", file=sys.stderr)
            return 1
        print(f"copied {out / 'passing.p4info.txtpb'} to {COMMITTED_P4INFO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
