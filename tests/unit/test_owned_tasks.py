"""Every background task has an owner: no task is started and forgotten, and nothing polls a flag in a
tight sleep loop where an event or a future says when."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "coderouterd"
_SPAWNERS = {"create_task", "ensure_future"}


def _spawner(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in _SPAWNERS:
            return name
    return None


def test_no_task_result_is_dropped():
    # A task nobody holds can be garbage-collected mid-flight, its exception goes unseen and shutdown
    # cannot wait for it: the result must be kept (a TaskSet, a set or dict the owner cancels, a variable).
    dropped = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Expr) and _spawner(node.value):
                dropped.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert dropped == []


def test_the_static_check_sees_a_dropped_task():
    tree = ast.parse("import asyncio\nasync def f(c):\n    asyncio.ensure_future(c)\n    t = asyncio.create_task(c)\n")
    found = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Expr) and _spawner(n.value)]
    assert found == [3]


def _tight_polls(tree: ast.AST) -> list[int]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.While):
            continue
        for stmt in node.body:
            call = stmt.value.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Await) else None
            if (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "sleep" and call.args
                    and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, int | float)
                    and call.args[0].value < 0.05):
                out.append(node.lineno)
    return out


def test_no_tight_polling_loops():
    polls = [f"{p.relative_to(PKG)}:{line}" for p in PKG.rglob("*.py") for line in _tight_polls(ast.parse(p.read_text()))]
    assert polls == []
    assert _tight_polls(ast.parse("async def f(s):\n    while not s.started:\n        await asyncio.sleep(0.005)\n"))
