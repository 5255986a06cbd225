"""Compile the TNA program (p4src/tna/) with the open Tofino compiler, p4c-barefoot from
p4lang/p4c's backends/tofino, and report what it takes of the chip (docs/tofino.md).

The compiler is in no package registry and is built outside this repository, as p4c and BMv2
are. It is found on PATH (or named with --p4c). The open compiler comes without Tofino's
assembler, which is what refuses a program longer than the chip in the closed toolchain: the
stage count is checked here instead, and a program that does not fit is an error.

    python -m passing.tna_build [--target tofino2] [--out DIR] [--p4c p4c-barefoot]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from passing.pipeline_files import BUILD_ROOT, P4SRC

P4C = "p4c-barefoot"
TNA_MAIN = P4SRC / "tna" / "passing_tna.p4"
# The P4Info as text (to read) and binary (P4InfoIndex.from_file: the text form's Tofino
# externs name message types only the Tofino runtime defines).
P4INFO_TEXT = "passing_tna.p4info.txtpb"
P4INFO_BIN = "passing_tna.p4info.bin"
# Target -> (architecture, match-action stages per gress). Tofino 1 cannot hold the program:
# its register actions return one word, and 64 values need 64 of them, 16 stages of 4.
TARGETS = {"tofino2": ("t2na", 20)}
NOT_SUPPORTED = {
    "tofino": "Tofino 1 is not a target of the TNA program: its register actions return one "
              "32-bit word, so the 64 values take 64 of them (16 stages of 4, beyond its 12) "
              "and need a second pass (docs/tofino.md, 'Tofino 1')",
}


class CompilerMissing(RuntimeError):
    """p4c-barefoot is not installed: it is built from p4lang/p4c outside this repository."""


@dataclass(frozen=True)
class Resources:
    """What the compiled program takes of one pipe: (used, available) per resource."""

    target: str
    ingress_stages: tuple[int, int]
    egress_stages: tuple[int, int]
    sram_blocks: tuple[int, int]
    map_ram_blocks: tuple[int, int]
    tcam_blocks: tuple[int, int]
    stateful_alus: tuple[int, int]
    phv_bits: tuple[int, int]

    def fits(self) -> bool:
        return all(used <= avail for used, avail in (
            self.ingress_stages, self.egress_stages, self.sram_blocks, self.map_ram_blocks,
            self.tcam_blocks, self.stateful_alus, self.phv_bits))

    def lines(self) -> list[str]:
        rows = [("ingress stages", self.ingress_stages), ("egress stages", self.egress_stages),
                ("SRAM blocks", self.sram_blocks), ("map RAM blocks", self.map_ram_blocks),
                ("TCAM blocks", self.tcam_blocks), ("stateful ALUs", self.stateful_alus),
                ("PHV bits", self.phv_bits)]
        return [f"{name:>15}: {used:>5} of {avail:>5} ({100 * used / avail:.0f}%)"
                for name, (used, avail) in rows]


def compiler_missing_message(p4c: str) -> str:
    return (f"cannot compile the TNA program: '{p4c}' (the open Tofino compiler) is not on "
            "PATH.\n  It is built from p4lang/p4c with -DENABLE_TOFINO=ON, outside this "
            "repository (docs/tofino.md), or name it: --p4c /path/to/p4c-barefoot.")


def compile_program(target: str, out: Path, p4c: str = P4C) -> Path:
    """Compile for `target` into `out`: the compiler's outputs, the P4Info in both forms, and
    resources.json under pipe/logs. Raises CompilerMissing, ValueError for a target the
    program does not support, subprocess.CalledProcessError when the compiler rejects it."""
    if target in NOT_SUPPORTED:
        raise ValueError(NOT_SUPPORTED[target])
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: choose {', '.join(TARGETS)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        # Only an earlier build is replaced: a mistyped --out never deletes anything else.
        if not (out / "manifest.json").is_file() or not (out / P4INFO_TEXT).is_file():
            raise ValueError(f"{out} is not empty and holds no earlier TNA build: "
                             "name a new directory with --out")
    if shutil.which(p4c) is None:
        raise CompilerMissing(compiler_missing_message(p4c))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    arch, _ = TARGETS[target]
    # Standard P4Runtime counters and registers in the P4Info, not Tofino externs: the
    # controller reads and zeroes its counters as P4Runtime CounterEntry on every target.
    subprocess.run([p4c, "--target", target, "--arch", arch, "-g", "-o", str(out),
                    "--p4runtime-force-std-externs",
                    "--p4runtime-files", f"{out / P4INFO_TEXT},{out / P4INFO_BIN}", str(TNA_MAIN)],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return out


def _stages(bfa: str, gress: str) -> int:
    return len(set(re.findall(rf"^stage (\d+) {gress}:", bfa, re.M)))


def resources(target: str, out: Path) -> Resources:
    """The resources of a compiled program, from its assembly (stages per gress) and the
    compiler's logs: resources.json (memories and ALUs, summed over the stages of the pipe, and
    the PHV containers there are) and phv.json (the containers the program uses)."""
    out = Path(out)
    _, stages = TARGETS[target]
    bfa = (out / "pipe" / f"{TNA_MAIN.stem}.bfa").read_text()
    logs = out / "pipe" / "logs"
    res = json.loads((logs / "resources.json").read_text())["resources"]
    mau = res["mau"]
    phv_total = sum(group["units"] * group["width"]
                    for groups in res["phv_containers"].values() for group in groups)
    phv_used = sum(c["bit_width"]
                   for c in json.loads((logs / "phv.json").read_text())["containers"])
    used = {"sram": 0, "map": 0, "tcam": 0, "salu": 0}
    for stage in mau["mau_stages"]:
        used["sram"] += len(stage["rams"]["srams"])
        used["map"] += len(stage["map_rams"]["maprams"])
        used["tcam"] += len(stage["tcams"]["tcams"])
        used["salu"] += len(stage["meter_alus"]["meters"])
    # Every stage of a chip has the same memories and ALUs.
    first = mau["mau_stages"][0]
    per_stage = {
        "sram": first["rams"]["nRows"] * first["rams"]["nColumns"],
        "map": first["map_rams"]["nRows"] * first["map_rams"]["nUnits"],
        "tcam": first["tcams"]["nRows"] * first["tcams"]["nColumns"],
        "salu": first["meter_alus"]["nAlus"],
    }
    total = {k: v * mau["nStages"] for k, v in per_stage.items()}
    return Resources(target=target,
                     ingress_stages=(_stages(bfa, "ingress"), stages),
                     egress_stages=(_stages(bfa, "egress"), stages),
                     sram_blocks=(used["sram"], total["sram"]),
                     map_ram_blocks=(used["map"], total["map"]),
                     tcam_blocks=(used["tcam"], total["tcam"]),
                     stateful_alus=(used["salu"], total["salu"]),
                     phv_bits=(phv_used, phv_total))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m passing.tna_build",
                                 description="Compile p4src/tna/ with the open Tofino compiler "
                                             "and report the resources it takes.")
    ap.add_argument("--target", default="tofino2", choices=[*TARGETS, *NOT_SUPPORTED])
    ap.add_argument("--out", type=Path, help="output directory (default: build/tna-<target>)")
    ap.add_argument("--p4c", default=P4C, help="the compiler (default: p4c-barefoot on PATH)")
    args = ap.parse_args(argv)
    out = args.out or BUILD_ROOT / f"tna-{args.target}"
    try:
        compile_program(args.target, out, args.p4c)
    except (CompilerMissing, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(e.stdout, file=sys.stderr)
        print(f"error: {args.p4c} rejected {TNA_MAIN}", file=sys.stderr)
        return 1
    res = resources(args.target, out)
    (out / "resources.summary.json").write_text(json.dumps(asdict(res), indent=2) + "\n")
    print(f"{TNA_MAIN} for {args.target}: {out}")
    print("\n".join(res.lines()))
    if not res.fits():
        print(f"error: the program does not fit {args.target} (above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
