"""Imports run one way: no module of coderouterd/, corectl/ or bench/ takes part in an import cycle, no package
of coderouterd/ (a top-level subpackage or module: coderouterd.routing, coderouterd.daemon) takes part in a
package cycle, and the lower layers never import the upper ones named below (docs/architecture.md: "each layer
imports only the layers below it").

Every import counts, those inside functions too (a lazy import still makes the two modules depend on each
other), and those under `if TYPE_CHECKING:` too: an annotation names a real dependency even if it never runs.
One under `if TYPE_CHECKING:` is left out only when its line (or the `if TYPE_CHECKING:` line, for the whole
block) says why it is acceptable, as `# layer-ok: <reason>`; the usual reason is that the composition root
(the daemon) hands itself in and the module only annotates what it reads of it. A runtime import cannot be
excused: the marker is refused there.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coderouterd", "corectl", "bench")  # bench: cycles only (its scripts are not layered)

# The marker that excuses one `if TYPE_CHECKING:` import (or a whole block) from the checks, with its reason.
LAYER_OK = re.compile(r"#\s*layer-ok:(.*)$")

# Below cluster/ (cluster coordination: shared breakers and budget, the state backend), which sits above routing and
# guards and below the daemon.
BELOW_CLUSTER = ("routing", "guards", "providers", "translate", "wire", "servers", "state", "config", "affinity",
                 "health", "quality", "supervise", "ingress", "upstream", "kvcache")

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
    # state/ (storage, the bus's events) is below routing and guards: what coordinates them is cluster/.
    ("coderouterd.state", "coderouterd.routing"),
    ("coderouterd.state", "coderouterd.guards"),
    # upstream/ (one Upstream per provider: breaker, hold, lifecycle, lease) is below routing, which plans over it,
    # and below supervise and health, which move it; the supervisor reaches routing only through it.
    *(("coderouterd.upstream", f"coderouterd.{above}") for above in ("routing", "supervise", "health", "affinity",
                                                                    "guards", "ingress", "quality")),
    ("coderouterd.supervise", "coderouterd.routing"),
    *((f"coderouterd.{below}", "coderouterd.cluster") for below in BELOW_CLUSTER),
    # kvcache/ (slot files) sits above providers and servers and below affinity, which holds its file pools, and
    # supervise, which calls its save before a stop: it is handed what it reads of them (kvcache/cache.Host).
    *(("coderouterd.kvcache", f"coderouterd.{above}") for above in ("affinity", "supervise", "routing", "ingress",
                                                                     "health", "admin", "ui", "daemon")),
    *((f"coderouterd.{below}", "coderouterd.kvcache") for below in ("providers", "servers", "state", "config", "wire",
                                                                      "translate")),
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


def _excuse(lines: list[str], first: int, last: int) -> str | None:
    """The `# layer-ok:` reason on source lines first..last (1-based), stripped ("" when the marker has none)."""
    for line in lines[first - 1:last]:
        m = LAYER_OK.search(line)
        if m:
            return m.group(1).strip()
    return None


def _markers(path: Path) -> list[tuple[int, str, bool]]:
    """Every `# layer-ok:` marker in a file, as (line, reason, whether it stands on an import under
    `if TYPE_CHECKING:` or on the `if TYPE_CHECKING:` line itself: the only places it means anything)."""
    text = path.read_text()
    lines = text.splitlines()
    placed: set[int] = set()

    def visit(node: ast.AST, checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            placed.add(node.lineno)
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, checking)
            return
        if checking and isinstance(node, ast.Import | ast.ImportFrom):
            placed.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        for child in ast.iter_child_nodes(node):
            visit(child, checking)

    visit(ast.parse(text), False)
    out = []
    for i, line in enumerate(lines, 1):
        m = LAYER_OK.search(line)
        if m:
            out.append((i, m.group(1).strip(), i in placed))
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that `name` imports (resolved: `from .x import y` is x.y when y is a module), those
    under `if TYPE_CHECKING:` included unless excused by a `# layer-ok:` marker."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    text = path.read_text()
    lines = text.splitlines()

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    def visit(node: ast.AST, checking: bool = False) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            if not _excuse(lines, node.lineno, node.lineno):  # a marker without a reason excuses nothing
                for child in node.body:
                    visit(child, True)
            for child in node.orelse:
                visit(child, checking)
            return
        if (checking and isinstance(node, ast.Import | ast.ImportFrom)
                and _excuse(lines, node.lineno, node.end_lineno or node.lineno)):
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
            visit(child, checking)

    visit(ast.parse(text))
    found.discard(name)
    # Importing a package's submodule runs the package's __init__ first, but that is not a dependency of the
    # importer on the package's other modules: only the edge to what is named counts.
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    # Parsed once for the three checks that read it (each only reads it): the tree's ~600 files take seconds.
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


def _package(module: str) -> str:
    """The package a module belongs to for the package-level check: coderouterd's top-level subpackage or module
    (coderouterd.routing.router -> coderouterd.routing, coderouterd.daemon -> itself), else the top package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "coderouterd" else parts[0]


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        edges = out.setdefault(_package(m), set())
        edges.update(p for p in map(_package, targets) if p != _package(m))
    return out


def _why(graph: dict[str, set[str]], cycle: list[str]) -> str:
    """The module imports that make a package cycle, to say where to cut it."""
    members = set(cycle)
    return ", ".join(f"{m} -> {t}" for m, targets in sorted(graph.items()) for t in sorted(targets)
                     if _package(m) in members and _package(t) in members and _package(m) != _package(t))


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


def test_no_package_cycles():
    # Modules can avoid a cycle one by one while their packages still depend on each other both ways (guards ->
    # state and state -> guards through different modules): that is a layering cycle too.
    graph = _graph()
    cycles = _cycles(_package_graph(graph))
    assert not cycles, "package cycles (move the shared piece down to the lower package, or hand it in): " + "; ".join(
        f"{' <-> '.join(c)} ({_why(graph, c)})" for c in cycles)


def test_every_layer_ok_marker_gives_a_reason_and_excuses_only_type_checking_imports():
    bad = [f"{path.relative_to(ROOT)}:{line}" + ("" if reason else " (no reason)") + ("" if placed else
           " (not on an `if TYPE_CHECKING:` import: a runtime import cannot be excused)")
           for path in _modules().values() for line, reason, placed in _markers(path) if not reason or not placed]
    assert not bad, "bad `# layer-ok:` markers: " + "; ".join(bad)


def test_the_checker_sees_cycles_and_type_checking_imports_unless_excused(tmp_path):
    # The checker itself: a cycle through a lazy import is found, and so is one through `if TYPE_CHECKING:`,
    # unless the import (or its block) says why it is acceptable.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from coderouterd.daemon import Daemon\n"
                   "    from coderouterd.runtime import (  # layer-ok: handed in by the root\n        Runtime)\n"
                   "def f():\n    from coderouterd import ids\n")
    modules = {"coderouterd.daemon": src, "coderouterd.ids": src, "coderouterd.m": src, "coderouterd.runtime": src}
    assert _imports("coderouterd.m", src, modules) == {"coderouterd.ids", "coderouterd.daemon"}
    assert _markers(src) == [(4, "handed in by the root", True)]
    block = tmp_path / "b.py"
    block.write_text("import typing\nif typing.TYPE_CHECKING:  # layer-ok: only names the root\n"
                     "    from coderouterd.daemon import Daemon\n")
    assert _imports("coderouterd.b", block, {"coderouterd.daemon": block, "coderouterd.b": block}) == set()
    # A marker without a reason, or on a runtime import, is reported (it excuses nothing there).
    wrong = tmp_path / "w.py"
    wrong.write_text("from coderouterd import ids  # layer-ok: it runs\nfrom typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from coderouterd import daemon  # layer-ok:\n")
    assert _markers(wrong) == [(1, "it runs", False), (4, "", True)]
    assert _imports("coderouterd.w", wrong, {"coderouterd.ids": wrong, "coderouterd.daemon": wrong,
                                             "coderouterd.w": wrong}) == {"coderouterd.ids", "coderouterd.daemon"}


def test_the_package_check_sees_a_cycle_the_modules_do_not_have():
    graph = {"coderouterd.guards.apply": {"coderouterd.state.events"}, "coderouterd.state.events": set(),
             "coderouterd.state.shared.budget": {"coderouterd.guards.budget"}, "coderouterd.guards.budget": set()}
    assert _cycles(graph) == []
    assert _cycles(_package_graph(graph)) == [["coderouterd.guards", "coderouterd.state"]]


# llama-server's HTTP API and command line: its paths, its slot actions and the flags coderouterd reads or adds.
# Only servers/llamacpp.py speaks them (its LlamaServer and flag helpers); everything else asks it (issue 43).
LLAMA_SERVER_ONLY = ROOT / "coderouterd" / "servers" / "llamacpp.py"
LLAMA_SPEECH = re.compile(r"/(?:slots|props|tokenize|apply-template)\b|[?&]action=(?:save|restore|erase)\b"
                          r"|--slot-save-path|--ctx-size|--parallel|^(?:-m|-c|-np|--model)$")


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module's code (f-strings' literal parts too), docstrings left out: a docstring
    may name a path; code that holds one speaks it."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def _llama_speakers(paths) -> list[str]:
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{line}: {text!r}" for p in paths
            if p != LLAMA_SERVER_ONLY
            for line, text in _string_literals(p) if LLAMA_SPEECH.search(text)]


def test_only_servers_llamacpp_speaks_llama_servers_api():
    found = _llama_speakers(sorted((ROOT / "coderouterd").rglob("*.py")))
    assert not found, "llama-server's API or flags outside servers/llamacpp.py (ask its LlamaServer): " + "; ".join(
        found)


def test_the_llama_server_grep_sees_paths_actions_and_flags(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Reads /props at start (a docstring may say so)."""\n'
                   'async def f(s, root, slot, action):\n'
                   '    """POST /slots/N."""\n'
                   '    await s.get(root + "/props")\n'
                   '    await s.post(f"{root}/slots/{slot}?action={action}")\n'
                   '    await s.post(f"{root}/slots/{slot}?action=restore")\n'
                   '    return ["llama-server", "-m", "x.gguf", "--slot-save-path", "/d"], "-mx", "/propsy"\n')
    found = _llama_speakers([src])
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted(
        ["'/props'", "'/slots/'", "'/slots/'", "'?action=restore'", "'-m'", "'--slot-save-path'"]), found


# What affinity may know of providers: a provider, its server's facts, and the adapter registry that speaks its
# server's own API. Everything else (calls, strategies, sessions, errors' plumbing) is the request path's.
AFFINITY_MAY_USE = frozenset({"coderouterd.providers.provider", "coderouterd.providers.server_info",
                              "coderouterd.providers.adapters"})


def test_affinity_uses_only_the_providers_public_face():
    graph = _graph()
    reached = sorted((importer, imported) for importer, imports in graph.items()
                     if importer.startswith("coderouterd.affinity") for imported in imports
                     if imported.startswith("coderouterd.providers") and imported not in AFFINITY_MAY_USE)
    assert not reached, f"affinity reaches into providers' internals: {reached}"
