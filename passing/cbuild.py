"""Building a C source of this package into a shared library on first use, keyed by content.

The model switch's PASSING path (switch_model/fastpath*.c) and the host agent's window
(host_agent/window.c) are compiled with the constants of passing.protocol (K among them) into
<build dir>/<name>-<hash>.so, the hash covering the source, the constants and the compiler, so
an edited source or another PASSING_K never runs a stale library. The build directory is
build/<name>/ of a checkout (an editable install) or ~/.cache/passing/<name> outside one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def build_dir(name: str) -> Path:
    """Where libraries called `name` are kept."""
    if (_CHECKOUT / "pyproject.toml").exists():
        return _CHECKOUT / "build" / name
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "passing" / name


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(sources: Path | Sequence[Path], name: str, defines: dict[str, int]) -> Path:
    """The library of `sources` (C units, and the headers they include, which are hashed but
    not compiled) compiled with `defines` (-D), built if not yet there; OSError without a
    compiler or when compiling fails."""
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler (cc or gcc) on PATH; install gcc (scripts/setup.sh does)")
    files = [sources] if isinstance(sources, Path) else list(sources)
    # A call to a function no unit defines must fail the build, not the switch at run time.
    flags = ["-O2", "-std=c11", "-shared", "-fPIC", "-Wall",
             "-Werror=implicit-function-declaration", "-Wl,-z,defs"] + \
        [f"-D{k}={v}" for k, v in sorted(defines.items())]
    digest = hashlib.sha256(" ".join([cc] + flags).encode())
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    key = digest.hexdigest()[:16]
    out_dir = build_dir(name)
    lib = out_dir / f"{name}-{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    # Several processes may start at once: each builds its own file, then renames it.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        units = [str(f) for f in files if f.suffix == ".c"]
        res = subprocess.run([cc, *flags, "-o", tmp, *units, "-lm"], capture_output=True,
                             text=True)
        if res.returncode:
            names = ", ".join(f.name for f in files)
            raise OSError(f"compiling {names} failed:\n{res.stderr.strip()}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib
