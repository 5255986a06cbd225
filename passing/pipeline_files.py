"""Where the P4 program, its committed P4Info, the shipped topologies and the compiled pipeline
live, in an installed wheel and in a checkout alike.

The P4 sources stay in p4src/ at the repository root (as p4lang projects keep them) and install
as the package data of `passing.p4src` (pyproject.toml maps that package onto p4src/); the
topology files are the package data of `topologies`. Both are found through importlib.resources:
in a wheel they are inside site-packages, in a checkout installed with `pip install -e .`
(scripts/setup.sh) the editable install maps the packages onto the checkout's directories.

A checkout whose `passing` package is imported straight from it (PYTHONPATH=<checkout>, or run
from its root) uses its own p4src/ and build/, even when the environment has another checkout
installed in editable mode: P4 sources and Python code then always come from one tree.

The P4Info is committed (p4src/passing.p4info.txtpb, compiled at protocol.DEFAULT_K; a test
checks it equals what p4c produces), so that the software switch model and the controller have
the pipeline's names and ids where p4c is absent. `passing.p4build` (`make build`) compiles the
program for this process's K (protocol.K, from PASSING_K) into BUILD_DIR = BUILD_ROOT/k<K>:
passing.json for BMv2, passing.p4info.txtpb, and passing.k recording the K it was built for.
"""

from __future__ import annotations

import json
import os
from importlib import metadata, resources
from pathlib import Path
from urllib.parse import unquote, urlparse

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from passing import protocol as P
from passing.p4info import sized_for_k

DIST = "passing"
K_STAMP = "passing.k"  # next to a build's outputs: the K it was compiled with


class BuildMismatch(RuntimeError):
    """A build directory holds a pipeline compiled for another K than this process runs."""


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


def _running_checkout() -> Path | None:
    """The checkout the imported `passing` package lies in, if it is imported from one (not
    from site-packages): its p4src/ sits next to it."""
    root = Path(__file__).resolve().parents[1]
    if (root / "p4src" / "passing.p4").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None


def _default_build_dir(checkout: Path | None) -> Path:
    # A checkout builds into its build/ (where `make build` writes); an installed wheel into the
    # user's cache, since site-packages may be read-only and is replaced on upgrade.
    if checkout is not None:
        return checkout / "build"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "passing" / "build"


_RUNNING = _running_checkout()
P4SRC = _RUNNING / "p4src" if _RUNNING else _package_dir("passing.p4src")
P4_MAIN = P4SRC / "passing.p4"
COMMITTED_P4INFO = P4SRC / "passing.p4info.txtpb"
TOPOLOGIES = _RUNNING / "topologies" if _RUNNING else _package_dir("topologies")
CHECKOUT = _RUNNING or source_checkout()
BUILD_ROOT = _default_build_dir(CHECKOUT)
# One build per K, side by side: changing PASSING_K never reuses (or overwrites) another K's.
BUILD_DIR = BUILD_ROOT / f"k{P.K}"


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


def built_k(build_dir: Path) -> int | None:
    """The K the build in `build_dir` was compiled with; None without a readable record."""
    try:
        return int((Path(build_dir) / K_STAMP).read_text().strip())
    except (OSError, ValueError):
        return None


def newer_source(build_dir: Path) -> Path | None:
    """A P4 source changed after the build in `build_dir` was compiled (the newest such), or
    None when the build's outputs are newer than every source (as make judges it)."""
    outputs = [Path(build_dir) / "passing.json", Path(build_dir) / "passing.p4info.txtpb"]
    built = min(p.stat().st_mtime for p in outputs)
    newest = max(p4_sources(), key=lambda src: src.stat().st_mtime)
    return newest if newest.stat().st_mtime > built else None


def load_p4info(path: str | Path | None = None) -> p4info_pb2.P4Info:
    """The P4Info text file at `path`, or without one the committed P4Info as p4c compiles it
    for this process's K (committed_p4info)."""
    if path is None:
        return committed_p4info()
    info = p4info_pb2.P4Info()
    text_format.Merge(Path(path).read_text(), info)
    return info


def committed_p4info(k: int = P.K) -> p4info_pb2.P4Info:
    """The committed P4Info (p4src/passing.p4info.txtpb, compiled at protocol.DEFAULT_K), sized
    for `k`: what the software switch model runs and the controller pushes where p4c is absent."""
    info = p4info_pb2.P4Info()
    text_format.Merge(COMMITTED_P4INFO.read_text(), info)
    return sized_for_k(info, k)


def pipeline_files(build_dir: Path = BUILD_DIR) -> tuple[p4info_pb2.P4Info, bytes]:
    """(P4Info, device config bytes) to push to a switch: the build if there is one, else the
    committed P4Info (sized for this K) with no device config (enough for the model; BMv2
    refuses it). A build for another K than this process's raises BuildMismatch: its switches
    would drop every packet of this K as malformed. So does a build older than a P4 source:
    BMv2 would run the program as it was, not as the agents and the controller now speak it."""
    build_dir = Path(build_dir)
    p4info, json_file = build_dir / "passing.p4info.txtpb", build_dir / "passing.json"
    if p4info.exists() and json_file.exists():
        k = built_k(build_dir)
        if k != P.K:
            other = f" or set {P.K_ENV}={k}" if k else ""
            raise BuildMismatch(
                f"{build_dir} holds a pipeline built for K={k or 'unknown'}, but "
                f"{P.K_ENV} gives K={P.K}: build it for this K (`make build` or "
                f"`python -m passing.p4build --out {build_dir}`){other}")
        changed = newer_source(build_dir)
        if changed is not None:
            raise BuildMismatch(
                f"{build_dir} was built before {changed} last changed: rebuild it (`make "
                f"build` or `python -m passing.p4build --out {build_dir}`), or remove it where "
                f"only the software model runs (it needs no build)")
        return load_p4info(p4info), json_file.read_bytes()
    return committed_p4info(), b""
