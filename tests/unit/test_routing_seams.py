"""The routing seams hold: routing never imports the HTTP edge, nobody wires the router from outside, and a
request's routine (Exchange) and its record (RequestRecord) are written only by their own modules."""

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


# The request's routine and its record (routing/executor.py, routing/record.py): the Exchange is written only by
# its own module; the record only by its own methods, and its outcome only by `end`. Observers and the other
# routing modules call the record's methods; they never assign or mutate a field of either object.

_MUTATORS = {"append", "extend", "insert", "remove", "pop", "clear", "update", "setdefault", "add", "discard",
             "sort", "reverse", "popitem"}
_EXCHANGE_NAMES = {"ex", "exchange"}
_RECORD_NAMES = {"record", "rec"}
# The request's inputs: the Exchange holds them too (it works with them), set once in its constructor.
_SHARED_INPUTS = {"req", "runtime", "profile_name", "profile"}


def _record_fields() -> set[str]:
    from coderouterd.routing.record import RequestRecord

    slots = set(RequestRecord.__slots__)
    return slots | {s.lstrip("_") for s in slots}  # `status` and `error_class` read `_status` / `_error_class`


def _writes(tree: ast.AST):
    """Every write to an attribute, as (line, owner expression, attribute, enclosing class, enclosing function):
    assignments (plain, augmented, annotated, unpacked, through a subscript), `del`, and in-place mutation by a
    method call (`x.attempts.append(...)`, `x.usage.update(...)`)."""

    def visit(node: ast.AST, cls: str, fn: str):
        if isinstance(node, ast.ClassDef):
            cls = node.name
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            fn = node.name
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _MUTATORS):
            targets = [node.func.value]
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t]):
                while isinstance(el, ast.Subscript):
                    el = el.value
                if isinstance(el, ast.Attribute):
                    yield node.lineno, el.value, el.attr, cls, fn
        for child in ast.iter_child_nodes(node):
            yield from visit(child, cls, fn)

    yield from visit(tree, "", "")


def _named(owner: ast.expr, names: set[str]) -> bool:
    """`ex.x`, or `self.ex.x` / `something.record.x`: the owner is known by one of `names`."""
    return (isinstance(owner, ast.Name) and owner.id in names) or (
        isinstance(owner, ast.Attribute) and owner.attr in names)


def _exchange_writes(source: str) -> list[int]:
    """Lines that write an Exchange's attribute (a module other than the executor's)."""
    return [line for line, owner, _attr, _c, _f in _writes(ast.parse(source)) if _named(owner, _EXCHANGE_NAMES)]


def _record_writes(source: str, fields: set[str]) -> list[int]:
    """Lines that write a field of the request's record from outside its module: through the record
    (`record.x`, `ex.record.x`), through an Exchange (`ex.status`: the old way), or as an Exchange's own field
    (`self.x` in class Exchange, other than the inputs its constructor shares with the record)."""
    out = []
    for line, owner, attr, cls, fn in _writes(ast.parse(source)):
        if attr not in fields:
            continue
        if _named(owner, _RECORD_NAMES | _EXCHANGE_NAMES) or (
                cls == "Exchange" and isinstance(owner, ast.Name) and owner.id == "self"
                and not (fn == "__init__" and attr in _SHARED_INPUTS)):
            out.append(line)
    return out


def test_no_attribute_of_an_exchange_is_written_outside_the_executor():
    offenders = [f"{p.relative_to(PKG)}:{line}" for p in PKG.rglob("*.py")
                 if p != PKG / "routing" / "executor.py" for line in _exchange_writes(p.read_text())]
    assert offenders == []


def test_no_field_of_the_request_record_is_written_outside_its_module():
    fields = _record_fields()
    offenders = [f"{p.relative_to(PKG)}:{line}" for p in PKG.rglob("*.py")
                 if p != PKG / "routing" / "record.py" for line in _record_writes(p.read_text(), fields)]
    assert offenders == []


def test_the_outcome_is_set_only_by_end():
    path = PKG / "routing" / "record.py"
    setters = {fn for _line, owner, attr, _cls, fn in _writes(ast.parse(path.read_text()))
               if attr in ("_status", "_error_class", "status", "error_class")
               and isinstance(owner, ast.Name) and owner.id == "self"}
    assert setters == {"__init__", "end"}

    from coderouterd.routing.record import RequestRecord

    for name in ("status", "error_class"):  # read-only from outside, at run time too
        prop = getattr(RequestRecord, name)
        assert isinstance(prop, property) and prop.fset is None


def test_the_record_checks_see_outside_writes():
    fields = {"status", "_status", "error_class", "served_by", "notes", "model_used", "cost_usd", "req"}
    src = ("def f(ex, record, r):\n"
           "    ex.status = 1\n"                       # 2: the old way, through the Exchange
           "    ex.record.served_by = 'a'\n"           # 3
           "    record.notes.append({})\n"             # 4: mutation in place
           "    r.status = 2\n"                         # another object's status: fine
           "    ex.committed, x = True, 1\n"           # 6: an Exchange's own field, from outside
           "    record._status += 1\n"                  # 7
           "class Exchange:\n"
           "    def __init__(self, req):\n"
           "        self.req = req\n"                   # a shared input, in the constructor: fine
           "    def serve(self, m):\n"
           "        self.model_used = m\n"              # 12: the record's field kept by the routine
           "        self.req = None\n")                 # 13: an input, rewritten later
    assert _record_writes(src, fields) == [2, 3, 4, 7, 12, 13]
    assert _exchange_writes(src) == [2, 6]  # line 3 writes the record, not the Exchange
