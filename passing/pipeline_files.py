"""Where the P4 program, its committed P4Info, the shipped topologies and the compiled pipeline
live, in an installed wheel and in a checkout alike.

The P4 sources stay in p4src/ at the repository root (as p4lang projects keep them) and install
as the package data of `passing.p4src` (pyproject.toml maps that package onto p4src/); the
topology files are the package data of `topologies`. Both are found through importlib.resources:
in a wheel they are inside site-packages, in a checkout installed with `pip install -e .`
(scripts/setup.sh) the editable install maps the packages onto the checkout's directories.

The P4Info is committed (p4src/passing.p4info.txtpb, a test checks it equals what p4c produces),
so that the software switch model and the controller have the pipeline's names and ids where p4c
is absent. `passing.p4build` (`make build`) compiles the program into BUILD_DIR:
passing.json for BMv2 and passing.p4info.txtpb.
"""

from __future__ import annotations

import json
import os
from importlib import metadata, resources
from pathlib import Path
from urllib.parse import unquote, urlparse

DIST = "passing"


def _package_dir(package: str) -> Path:
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        raise ImportError(f"{package} is not installed: the P4 sources and topologies are "
                          "package data, install the project (scripts/setup.sh, "
                          "or pip install .)") from e
    # Installed packages are directories on disk (pip never installs this one zipped), and
    # p4c and BMv2 want real paths.
    return Path(str(root))


def source_checkout() -> Path | None:
    """The checkout this distribution is installed from in editable mode (`pip install -e .`),
    as its installation records it (PEP 610 direct_url.json); None for a wheel."""
    try:
        text = metadata.distribution(DIST).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    info = json.loads(text)
    url = urlparse(info.get("url", ""))
    if not info.get("dir_info", {}).get("editable") or url.scheme != "file":
        return None
    return Path(unquote(url.path))


def _default_build_dir(checkout: Path | None) -> Path:
    # A checkout builds into its build/ (where `make build` writes); an installed wheel into the
    # user's cache, since site-packages may be read-only and is replaced on upgrade.
    if checkout is not None:
        return checkout / "build"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "passing" / "build"


P4SRC = _package_dir("passing.p4src")
P4_MAIN = P4SRC / "passing.p4"
COMMITTED_P4INFO = P4SRC / "passing.p4info.txtpb"
TOPOLOGIES = _package_dir("topologies")
CHECKOUT = source_checkout()
BUILD_DIR = _default_build_dir(CHECKOUT)


def p4_sources() -> list[Path]:
    """Every P4 file of the program (what a build depends on)."""
    return sorted([*P4SRC.glob("*.p4"), *P4SRC.glob("include/*.p4")])


def topology_file(name: str) -> Path:
    """A shipped topology by name (`star`, `leafspine`)."""
    path = TOPOLOGIES / f"{name}.json"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in TOPOLOGIES.glob("*.json")))
        raise FileNotFoundError(f"no shipped topology {name!r} (shipped: {shipped})")
    return path


def pipeline_files(build_dir: Path = BUILD_DIR) -> tuple[Path, bytes]:
    """(P4Info path, device config bytes) to push to a switch: the build if there is one, else
    the committed P4Info with no device config (enough for the model; BMv2 refuses it)."""
    p4info, json_file = build_dir / "passing.p4info.txtpb", build_dir / "passing.json"
    if p4info.exists() and json_file.exists():
        return p4info, json_file.read_bytes()
    return COMMITTED_P4INFO, b""
