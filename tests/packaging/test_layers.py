"""The product's layers: what users install never imports the benchmark harness (bench/) or the
test harness (testbed/), and no two of its modules import each other, directly or round a loop.

Imports are read from the source (every `import` and `from ... import`, inside functions and
under TYPE_CHECKING too: a lazy import is still a dependency a reader has to follow)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("passing", "passing_agent", "host_agent", "controller", "switch_model", "topologies")
HARNESS = ("bench", "testbed", "tests")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    return {_module_name(p): p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(path: Path, name: str) -> set[str]:
    """Every module `path` (module `name`) names in an import statement, made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from pkg import mod` imports the module pkg.mod when there is one.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path, name) if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_never_imports_the_harness(package):
    bad = []
    for name, path in _modules((package,)).items():
        for imported in sorted(_imports(path, name)):
            if imported.split(".")[0] in HARNESS:
                bad.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not bad, "the product imports its harness:\n" + "\n".join(bad)


def test_no_import_circle_in_the_product():
    # Packages' __init__ files that only hand names on would tie every module of a package to
    # every other; they are left out as the structure drawing leaves them out.
    modules = {n: p for n, p in _modules(PRODUCT).items() if p.name != "__init__.py"}
    cycles = _cycles(_graph(modules))
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_circle_finder_finds_a_circle(tmp_path):
    """The check above could pass by finding nothing at all: it must see a loop of three."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_from_imports_are_read(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    mod = pkg / "mod.py"
    mod.write_text("from . import other\nfrom .sub import thing\nimport bench.sweep\n"
                   "def f():\n    from testbed import fabric\n")
    found = _imports(mod, "pkg.mod")
    assert {"pkg.other", "pkg.sub", "bench.sweep", "testbed", "testbed.fabric"} <= found
