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
