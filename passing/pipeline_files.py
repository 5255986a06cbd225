"""Where the compiled pipeline lives.

`make build` writes build/passing.json (BMv2) and build/passing.p4info.txtpb. The P4Info is also
committed as p4src/passing.p4info.txtpb (a test checks it equals what p4c produces), so that the
software switch model and the controller have the pipeline's names and ids where p4c is absent.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_DIR = REPO / "build"
COMMITTED_P4INFO = REPO / "p4src" / "passing.p4info.txtpb"


def pipeline_files(build_dir: Path = BUILD_DIR) -> tuple[Path, bytes]:
    """(P4Info path, device config bytes) to push to a switch: the build if there is one, else
    the committed P4Info with no device config (enough for the model; BMv2 refuses it)."""
    p4info, json = build_dir / "passing.p4info.txtpb", build_dir / "passing.json"
    if p4info.exists() and json.exists():
        return p4info, json.read_bytes()
    return COMMITTED_P4INFO, b""
