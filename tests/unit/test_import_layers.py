"""Imports run one way: no module of coderouterd/, corectl/ or bench/ takes part in an import cycle, and the lower
layers never import the upper ones named below (docs/architecture.md: "each layer imports only the layers
below it").

Every import counts, those inside functions too (a lazy import still makes the two modules depend on each
other), except those under `if TYPE_CHECKING:`, which never run: annotating a seam with a type from above is
how a lower layer names what it is handed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coderouterd", "corectl", "bench")  # bench: cycles only (its scripts are not layered)

# (importer prefix, imported prefix): modules under the first must not import modules under the second.
FORBIDDEN = [
    # Providers and translation are below health/, quality/ and affinity/: they are handed what they need.
    ("coderouterd.providers", "coderouterd.health"),
    ("coderouterd.providers", "coderouterd.quality"),
    ("coderouterd.providers", "coderouterd.affinity"),
    ("coderouterd.translate", "coderouterd.health"),
    ("coderouterd.translate", "coderouterd.quality"),
    ("coderouterd.translate", "coderouterd.affinity"),
    # The config schema is below the providers it configures.
    ("coderouterd.config", "coderouterd.providers"),
    ("coderouterd.routing", "coderouterd.ingress"),
    # wire/ (SSE, error kinds, shared Anthropic events) is below everything that speaks a wire.
    *(("coderouterd.wire", f"coderouterd.{above}") for above in ("translate", "providers", "routing", "ingress")),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that `name` imports (resolved: `from .x import y` is x.y when y is a module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    hit = resolve(alias.name)
                    if hit:
                        found.add(hit)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] in PACKAGES:
                for alias in node.names:
                    hit = resolve(f"{mod}.{alias.name}")
                    if hit:
                        found.add(hit)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    # Importing a package's submodule runs the package's __init__ first, but that is not a dependency of the
    # importer on the package's other modules: only the edge to what is named counts.
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
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
            strongconnect(v)
    return out


def _is_package_init_edge(importer: str, imported: str) -> bool:
    # A package's __init__ that re-exports its submodules, and a submodule that imports a sibling through the
    # package (`from . import x`), are one unit: that is how a package is assembled, not a layering cycle.
    return importer.startswith(imported + ".") or imported.startswith(importer + ".")


def test_no_import_cycles():
    graph = _graph()
    pruned = {m: {t for t in targets if not _is_package_init_edge(m, t)} for m, targets in graph.items()}
    cycles = _cycles(pruned)
    assert not cycles, "import cycles (move the shared piece down a layer): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_upward_imports():
    graph = _graph()
    found = [f"{m} imports {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
             for low, high in FORBIDDEN if (m == low or m.startswith(low + ".")) and (
                 t == high or t.startswith(high + "."))]
    assert not found, "upward imports: " + "; ".join(found)


def test_the_checker_sees_cycles_and_ignores_type_checking_imports(tmp_path):
    # The checker itself: a cycle through a lazy import is found, one through `if TYPE_CHECKING:` is not.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from coderouterd.daemon import Daemon\n"
                   "def f():\n    from coderouterd import ids\n")
    modules = {"coderouterd.daemon": src, "coderouterd.ids": src, "coderouterd.m": src}
    assert _imports("coderouterd.m", src, modules) == {"coderouterd.ids"}
