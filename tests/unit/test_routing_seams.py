"""The routing seams hold: routing never imports the HTTP edge, and nobody wires the router from outside."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "coderouterd"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out.add(base)
    return out


def test_no_routing_module_imports_ingress():
    for path in (PKG / "routing").glob("*.py"):
        for name in _imports(path):
            assert "ingress" not in name, f"{path.name} imports {name}"


def test_no_attribute_of_the_router_or_routing_state_is_assigned_from_outside():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.parent.name == "routing":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign | ast.AnnAssign) else []
            for t in targets:
                # router.x = ..., daemon.router.x = ..., routing.x[...] = ...
                while isinstance(t, ast.Subscript):
                    t = t.value
                if isinstance(t, ast.Attribute):
                    owner = t.value
                    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                    if name in ("router", "routing", "state") and path.name != "daemon.py" or (
                            name in ("router", "routing") and path.name == "daemon.py"):
                        offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert offenders == []


# The daemon's parts are built with what they need (Daemon.__init__/startup pass hooks and collaborators to
# their constructors); nobody plugs a hook in or swaps a field of another part afterwards.
_PARTS = {"daemon", "router", "routing", "affinity", "memory", "telemetry", "persisted", "budget", "drift",
          "selfheal", "health", "processes", "runtime", "supervisor", "metrics"}


def _assigned_attributes(tree: ast.AST):
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign | ast.AnnAssign) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                while isinstance(el, ast.Subscript):
                    el = el.value
                if isinstance(el, ast.Attribute):
                    yield node.lineno, el


def _offenders(source: str) -> list[int]:
    out = []
    for line, attr in _assigned_attributes(ast.parse(source)):
        owner = attr.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        # another part's field (daemon.x = ..., self.router.x = ...), or anyone's private field (p._x = ...)
        if name in _PARTS or attr.attr.startswith("_") and not attr.attr.endswith("__"):
            out.append(line)
    return out


def test_no_part_of_the_daemon_is_wired_from_outside():
    offenders = [f"{p.relative_to(PKG)}:{line}" for p in PKG.rglob("*.py") for line in _offenders(p.read_text())]
    assert offenders == []


def test_the_wiring_check_sees_outside_assignments():
    src = ("def f(daemon, p, self):\n    daemon.connection_limits = 1\n    self.affinity.persist = 2\n"
           "    p._models, p.x = 3, 4\n    self.ok = 5\n    p.fine = 6\n")
    assert _offenders(src) == [2, 3, 4]
