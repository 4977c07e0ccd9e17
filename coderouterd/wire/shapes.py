"""A small language for the shape of a JSON answer, and its compiler to a checker (issue 34, item 4).

A description is plain data, so one description per protocol (wire/answer_shapes.py) serves both the check on
the answer path and the property test that generates wrong shapes from it:

- `str`, `int`, `float`, `bool`, `dict`, `list`: a value of that JSON type (`int` is never a boolean; `float`
  accepts an integer too; `dict` and `list` say nothing of what is inside);
- `{"name": spec, "other?": spec}`: an object; a plain name is required (present, not null), a name ending in
  "?" is optional (absent or null, or else as `spec`). Other keys are not looked at: APIs keep adding fields;
- `Many(spec, min=0)`: an array of `spec`, with at least `min` items;
- `Tagged("type", {"text": {...}, ...})`: an object whose `type` (a string, required) picks its description;
  a tag not named passes (new block and delta types appear), a non-object or a missing tag does not;
- `Const("message")`: exactly that string.

Only what a client relies on is described: the fields it reads, with their types. A value of another shape is
no answer of the protocol, whatever its HTTP status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A compiled check: the value in, None when it fits, else where and how it does not ("choices[0].message: ...").
Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Many:
    item: Any
    min: int = 0


@dataclass(frozen=True)
class Tagged:
    tag: str
    cases: dict[str, Any]


@dataclass(frozen=True)
class Const:
    value: str


_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
               list: "an array"}


# The Python types a JSON value of each described type may have (a float field takes an integer too).
_TYPES = {str: (str,), int: (int,), float: (float, int), bool: (bool,), dict: (dict,), list: (list,)}


def type_name(v: Any) -> str:
    if v is None:
        return "null"
    if type(v) is bool:
        return "a boolean"
    return _JSON_NAMES.get(type(v), type(v).__name__)


def _type_check(t: type) -> Check:
    want = _JSON_NAMES[t]
    if t is float:
        def check(v: Any) -> str | None:
            return None if type(v) in (float, int) else f": expected {want}, got {type_name(v)}"
    else:
        def check(v: Any) -> str | None:  # type(v) is t: a boolean is no integer here
            return None if type(v) is t else f": expected {want}, got {type_name(v)}"
    return check


def fields(spec: dict) -> list[tuple[str, bool, Any]]:
    """(name, required, spec) for each field of an object description."""
    return [(k[:-1], False, v) if k.endswith("?") else (k, True, v) for k, v in spec.items()]


def compile_shape(spec: Any) -> Check:
    """The checker for a description. Compiled once: a check is then a few dict lookups and type tests."""
    if isinstance(spec, type):
        return _type_check(spec)
    if isinstance(spec, Const):
        value = spec.value

        def const(v: Any) -> str | None:
            return None if v == value else f": expected {value!r}, got {type_name(v) if type(v) is not str else repr(v[:40])}"
        return const
    if isinstance(spec, Many):
        item, least = compile_shape(spec.item), spec.min

        def many(v: Any) -> str | None:
            if type(v) is not list:
                return f": expected an array, got {type_name(v)}"
            if len(v) < least:
                return f": expected at least {least} item{'s' if least > 1 else ''}, got {len(v)}"
            for i, x in enumerate(v):
                p = item(x)
                if p is not None:
                    return f"[{i}]{p}"
            return None
        return many
    if isinstance(spec, Tagged):
        tag = spec.tag
        cases = {k: compile_shape(v) for k, v in spec.cases.items()}

        def tagged(v: Any) -> str | None:
            if type(v) is not dict:
                return f": expected an object, got {type_name(v)}"
            kind = v.get(tag)
            if type(kind) is not str:
                return f".{tag}: expected a string, got {type_name(kind)}"
            case = cases.get(kind)
            return None if case is None else case(v)
        return tagged
    if isinstance(spec, dict):
        # Fields of a plain type are tested inline (`type(x) in types`): no call per field on the hot path.
        parts = [(name, required, _TYPES.get(s) if isinstance(s, type) else None, compile_shape(s))
                 for name, required, s in fields(spec)]

        def obj(v: Any) -> str | None:
            if type(v) is not dict:
                return f": expected an object, got {type_name(v)}"
            get = v.get
            for name, required, types, check in parts:
                x = get(name)
                if x is None:
                    if required:
                        return f".{name}: required, got {'null' if name in v else 'nothing'}"
                    continue
                if types is not None:
                    if type(x) in types:
                        continue
                    p = check(x)
                else:
                    p = check(x)
                if p is not None:
                    return f".{name}{p}"
            return None
        return obj
    raise TypeError(f"not a shape description: {spec!r}")


def checker(spec: Any, what: str) -> Callable[[Any], str | None]:
    """A check that names the whole ("a chat completion with choices[0].message: required, got null")."""
    check = compile_shape(spec)

    def named(v: Any) -> str | None:
        p = check(v)
        if p is None:
            return None
        return f"{what} with {p.lstrip('.') if p[0] == '.' else 'its top level' + p}"
    return named


def event_checker(cases: dict[str, Any], what: str) -> Callable[[str | None, Any], str | None]:
    """A check for one event of a stream: its SSE `event:` name (or, without one, its data's `type`) picks the
    description; an event not named passes, as long as its data is an object."""
    compiled = {k: compile_shape(v) for k, v in cases.items()}

    def check(name: str | None, v: Any) -> str | None:
        if type(v) is not dict:
            return f"{what} whose data is {type_name(v)}"
        case = compiled.get(name or v.get("type"))  # type: ignore[arg-type]
        if case is None:
            return None
        p = case(v)
        return None if p is None else f"{what} {name or v.get('type')} with {p.lstrip('.')}"
    return check
