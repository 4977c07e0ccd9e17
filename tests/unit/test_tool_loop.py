import copy
import time

import orjson
import pytest

from coderouterd.config.schema import ToolLoopConfig
from coderouterd.guards import tool_loop
from coderouterd.guards.tool_loop import (
    LoopFinding,
    check,
    check_anthropic,
    check_openai,
    detect,
    inject_anthropic,
    inject_openai,
    tool_calls_anthropic,
    tool_calls_openai,
)
from coderouterd.state.events import GuardFired

# -- history builders: a step is (tool, input) for one call, a list of those for parallel calls, or a
# string for a human turn --------------------------------------------------------------------------------


def _anthropic(steps, *, key_order_flip=False):
    msgs = [{"role": "user", "content": "fix the build"}]
    n = 0
    for step in steps:
        if isinstance(step, str):
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": "done?"}]})
            msgs.append({"role": "user", "content": [{"type": "text", "text": step}]})
            continue
        calls = step if isinstance(step, list) else [step]
        blocks, results = [{"type": "text", "text": "let me look"}], []
        for name, inp in calls:
            n += 1
            if key_order_flip and n % 2:
                inp = dict(reversed(list(inp.items())))
            blocks.append({"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": inp})
            results.append({"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "same output"})
        msgs.append({"role": "assistant", "content": blocks})
        msgs.append({"role": "user", "content": results})
    return msgs


def _openai(steps, *, key_order_flip=False):
    msgs = [{"role": "system", "content": "be useful"}, {"role": "user", "content": "fix the build"}]
    n = 0
    for step in steps:
        if isinstance(step, str):
            msgs.append({"role": "assistant", "content": "done?"})
            msgs.append({"role": "user", "content": step})
            continue
        calls = step if isinstance(step, list) else [step]
        tool_calls, results = [], []
        for name, inp in calls:
            n += 1
            if key_order_flip and n % 2:
                args = orjson.dumps(dict(reversed(list(inp.items())))).decode().replace(",", ", ")
            else:
                args = orjson.dumps(inp).decode()
            tool_calls.append({"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}})
            results.append({"role": "tool", "tool_call_id": f"call_{n}", "content": "same output"})
        msgs.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        msgs.extend(results)
    return msgs


WIRES = [("anthropic", _anthropic, check_anthropic), ("openai", _openai, check_openai)]

LS = ("Bash", {"command": "ls", "timeout": 5})
CAT = ("Bash", {"command": "cat a.py", "timeout": 5})
READ = ("Read", {"file_path": "/a.py"})
READ_LS = ("Read", {"command": "ls", "timeout": 5})  # Bash's input under another tool name

# (case, steps, threshold, window, max_tool_calls, expected (tool, repeats) or None)
CASES = [
    ("same input 3x in a row", [LS, LS, LS], 3, 5, 0, ("Bash", 3)),
    ("only 2x in a row", [READ, LS, LS], 3, 5, 0, None),
    ("different inputs", [LS, CAT, READ, LS, CAT], 3, 5, 0, None),
    ("same input, other tool name", [LS, READ_LS, LS], 3, 5, 0, None),
    ("loop interrupted by another call", [LS, LS, READ, LS, LS], 3, 5, 0, None),
    ("loop no longer at the end", [LS, LS, LS, READ], 3, 5, 0, None),
    ("run longer than threshold reports its length", [READ, LS, LS, LS, LS], 3, 5, 0, ("Bash", 4)),
    ("run counted only inside the window", [LS] * 8, 3, 5, 0, ("Bash", 5)),
    ("window smaller than threshold never fires", [LS] * 6, 3, 2, 0, None),
    ("window equal to threshold", [READ, LS, LS, LS], 3, 3, 0, ("Bash", 3)),
    ("parallel calls in one turn count in order", [[READ, LS], [LS, LS]], 3, 5, 0, ("Bash", 3)),
    ("human turn resets the run", [LS, LS, "try harder", LS], 3, 5, 0, None),
    ("human turn after the loop ends it", [LS, LS, LS, "stop that"], 3, 5, 0, None),
    ("loop after a human turn still caught", [READ, "go on", LS, LS, LS], 3, 5, 0, ("Bash", 3)),
    ("max_tool_calls exceeded", [LS, CAT, READ, CAT], 3, 5, 3, ("*", 4)),
    ("max_tool_calls reached, not exceeded", [LS, CAT, READ], 3, 5, 3, None),
    ("max_tool_calls counts the current run only", [LS, CAT, READ, "next task", CAT, READ], 3, 5, 3, None),
    ("repeat wins over the cap", [CAT, LS, LS, LS], 3, 5, 2, ("Bash", 3)),
    ("no tool calls", [], 3, 5, 1, None),
]


@pytest.mark.parametrize("wire, build, check_fn", WIRES, ids=[w[0] for w in WIRES])
@pytest.mark.parametrize("case, steps, threshold, window, max_calls, expected", CASES, ids=[c[0] for c in CASES])
def test_detection_table(wire, build, check_fn, case, steps, threshold, window, max_calls, expected):
    messages = build(steps)
    found = check_fn(messages, threshold=threshold, window=window, max_tool_calls=max_calls)
    if expected is None:
        assert found is None, case
        return
    assert found is not None, case
    assert (found.tool, found.repeats) == expected
    # The bounded walk and the plain extraction + detect must agree.
    calls = tool_calls_anthropic(messages) if wire == "anthropic" else tool_calls_openai(messages)
    assert detect(calls, threshold=threshold, window=window, max_tool_calls=max_calls) == found


@pytest.mark.parametrize("wire, build, check_fn", WIRES, ids=[w[0] for w in WIRES])
def test_key_order_does_not_hide_a_loop(wire, build, check_fn):
    messages = build([LS, LS, LS], key_order_flip=True)
    calls = tool_calls_anthropic(messages) if wire == "anthropic" else tool_calls_openai(messages)
    assert calls == [("Bash", '{"command":"ls","timeout":5}')] * 3
    assert check_fn(messages, threshold=3, window=5).tool == "Bash"


def test_anthropic_extraction_order_limit_and_merged_user_turns():
    messages = _anthropic([READ, [LS, CAT]])
    assert tool_calls_anthropic(messages) == [
        ("Read", '{"file_path":"/a.py"}'),
        ("Bash", '{"command":"ls","timeout":5}'),
        ("Bash", '{"command":"cat a.py","timeout":5}'),
    ]
    assert [c[1] for c in tool_calls_anthropic(messages, limit=2)] == [
        '{"command":"ls","timeout":5}', '{"command":"cat a.py","timeout":5}']
    # Claude Code's mid-conversation system entries and text-only user messages next to tool results
    # belong to the agent run.
    looping = _anthropic([LS, LS, LS])
    looping.insert(1, {"role": "system", "content": "agents and skills"})
    looping.append({"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}]})
    assert check_anthropic(looping, threshold=3, window=5).repeats == 3


def test_openai_arguments_canonicalised_or_kept_raw():
    def call(args):
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "sh", "arguments": args}}]}

    tool = {"role": "tool", "tool_call_id": "c", "content": "x"}
    messages = [{"role": "user", "content": "go"}]
    for args in ('{"b": 1, "a": [1, 2]}', "not json{", "", {"a": 1}):
        messages += [call(args), tool]
    assert tool_calls_openai(messages) == [
        ("sh", '{"a":[1,2],"b":1}'), ("sh", "not json{"), ("sh", ""), ("sh", '{"a":1}')]
    broken = [{"role": "user", "content": "go"}] + [call("not json{"), tool] * 3
    assert check_openai(broken, threshold=3, window=5).tool == "sh"
    near = [{"role": "user", "content": "go"}, call("not json{"), tool, call("not  json{"), tool, call("not json{"), tool]
    assert check_openai(near, threshold=3, window=5) is None


def test_odd_shapes_are_ignored_not_fatal():
    messages = [
        "junk", None, {"role": "assistant", "content": "plain text"},
        {"role": "assistant", "content": [None, {"type": "tool_use"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
        {"role": "assistant", "tool_calls": [None, {"function": None}]},
    ]
    assert tool_calls_anthropic(messages) == [("", "null")]
    assert tool_calls_openai(messages) == []
    assert tool_loop.canonical({"n": 2**70}) == '{"n": 1180591620717411303424}'


def test_detect_on_plain_call_lists():
    a, b = ("Bash", '{"command":"ls"}'), ("Read", '{"file_path":"/x"}')
    assert detect([a, a, a], threshold=3, window=5).repeats == 3
    assert detect([a, a, a], threshold=4, window=5) is None
    assert detect([a, a, b], threshold=2, window=5) is None
    assert detect([b, b], threshold=2, window=2).tool == "Read"
    assert detect([], threshold=3, window=5) is None
    capped = detect([a, b], threshold=3, window=5, max_tool_calls=10, total_tool_calls=11)
    assert (capped.tool, capped.total_tool_calls, capped.max_tool_calls) == ("*", 11, 10)
    same_digest = detect([b, a, a, a], threshold=3, window=5).input_digest
    assert same_digest == detect([a, a, a], threshold=3, window=3).input_digest
    assert same_digest != detect([b, b, b], threshold=3, window=3).input_digest


def test_finding_reports_the_whole_run_even_though_the_walk_is_bounded():
    steps = [("Read", {"file_path": f"/f{i}"}) for i in range(10)] + [LS, LS, LS]
    for build, check_fn in ((_anthropic, check_anthropic), (_openai, check_openai)):
        found = check_fn(build(steps), threshold=3, window=5)
        assert found.total_tool_calls == 13


def test_finding_detail_message_and_event():
    found = check_anthropic(_anthropic([READ, LS, LS, LS]), threshold=3, window=5)
    assert found.detail() == {"tool": "Bash", "repeat_count": 3, "threshold": 3, "window": 5, "total_tool_calls": 4}
    assert found.message() == (
        "tool loop detected: Bash called 3 times in a row with the same input (threshold 3, window 5)")
    assert len(found.input_digest) == 16 and "ls" not in found.input_digest
    event = found.event("req_1", "break")
    assert isinstance(event, GuardFired)
    assert (event.request_id, event.guard, event.action, event.detail) == ("req_1", "tool_loop", "break", found.detail())

    cap = check_openai(_openai([LS, CAT, READ]), threshold=3, window=5, max_tool_calls=2)
    assert cap.detail()["max_tool_calls"] == 2 and cap.detail()["tool"] == "*"
    assert cap.message() == "tool call limit exceeded: 3 tool calls since the last user message (max 2)"


def test_check_entry_point_takes_config_and_body():
    cfg = ToolLoopConfig(action="break", threshold=3, window=5)
    assert check("anthropic", {"messages": _anthropic([LS, LS, LS])}, cfg).tool == "Bash"
    assert check("openai", {"messages": _openai([LS, LS, LS])}, cfg).tool == "Bash"
    assert check("openai", {"messages": _openai([LS, LS])}, cfg) is None
    assert check("anthropic", {"model": "m"}, cfg) is None
    assert check("anthropic", {"messages": "nope"}, cfg) is None


FINDING = LoopFinding(tool="Bash", repeats=3, threshold=3, window=5, input_digest="ab", total_tool_calls=3)


@pytest.mark.parametrize(
    "system, expect",
    [
        (None, "str"),
        ("", "str"),
        ("You are Claude Code.", "str"),
        ([{"type": "text", "text": "billing"}, {"type": "text", "text": "id", "cache_control": {"type": "ephemeral"}}],
         "list"),
    ],
    ids=["absent", "empty", "string", "blocks"],
)
def test_inject_anthropic_keeps_system_shape(system, expect):
    body = {"model": "m", "max_tokens": 10, "messages": _anthropic([LS, LS, LS])}
    if system is not None:
        body["system"] = system
    before = copy.deepcopy(body)
    out = inject_anthropic(body, FINDING)
    assert body == before  # the input is untouched
    assert out is not body and out["messages"] == body["messages"] and out["model"] == "m"
    if expect == "list":
        assert out["system"][:-1] == system  # cached prefix blocks unchanged, in place
        assert out["system"][-1]["type"] == "text" and "Bash" in out["system"][-1]["text"]
    else:
        assert isinstance(out["system"], str)
        if system:
            assert out["system"].startswith(system + "\n\n")
        assert "repeating yourself" in out["system"] and "Bash" in out["system"]


@pytest.mark.parametrize(
    "first, expect",
    [
        ({"role": "system", "content": "be useful"}, "appended"),
        ({"role": "developer", "content": "be useful"}, "appended"),
        ({"role": "system", "content": [{"type": "text", "text": "be useful"}]}, "parts"),
        ({"role": "system", "content": None}, "replaced"),
        ({"role": "user", "content": "hi"}, "inserted"),
        (None, "inserted"),
    ],
    ids=["system-str", "developer", "system-parts", "system-null", "no-system", "no-messages"],
)
def test_inject_openai_appends_to_leading_system_or_inserts_one(first, expect):
    body = {"model": "m", "messages": [first] if first else []}
    before = copy.deepcopy(body)
    out = inject_openai(body, FINDING)
    assert body == before
    msgs = out["messages"]
    if expect == "inserted":
        assert msgs[0]["role"] == "system" and "repeating yourself" in msgs[0]["content"]
        assert msgs[1:] == before["messages"]
    elif expect == "parts":
        assert msgs[0]["content"][0] == {"type": "text", "text": "be useful"}
        assert "repeating yourself" in msgs[0]["content"][1]["text"]
    elif expect == "appended":
        assert msgs[0]["role"] == first["role"]
        assert msgs[0]["content"].startswith("be useful\n\n") and "Bash" in msgs[0]["content"]
    else:
        assert "repeating yourself" in msgs[0]["content"]
    assert len([m for m in msgs if m["role"] in ("system", "developer")]) == 1


def test_inject_note_for_the_cap_asks_to_stop():
    cap = LoopFinding(tool="*", repeats=41, threshold=40, window=5, input_digest="", total_tool_calls=41,
                      max_tool_calls=40)
    out = tool_loop.inject("anthropic", {"messages": []}, cap)
    assert "41 tool calls" in out["system"] and "Stop calling tools" in out["system"]
    assert tool_loop.inject("openai", {"messages": []}, cap)["messages"][0]["role"] == "system"


def _long_history(wire):
    """400 messages in Claude Code's shape: varied calls with realistic inputs and bulky results."""
    steps = [("Bash", {"command": f"pytest tests/test_{i}.py -x", "description": "run tests " * 20,
                       "timeout": 120000}) for i in range(200)]
    msgs = (_anthropic if wire == "anthropic" else _openai)(steps)
    big = "line of output\n" * 400
    for m in msgs:
        if isinstance(m.get("content"), list):
            for block in m["content"]:
                if block.get("type") == "tool_result":
                    block["content"] = big
        elif m.get("role") == "tool":
            m["content"] = big
    return msgs


@pytest.mark.parametrize("wire, check_fn", [("anthropic", check_anthropic), ("openai", check_openai)])
def test_detect_on_a_400_message_history_is_fast(wire, check_fn):
    msgs = _long_history(wire)
    assert len(msgs) >= 400
    looping = msgs + msgs[-2:] + msgs[-2:]  # the last call twice more: a loop of 3
    cases = [(msgs, 0, None), (msgs, 1000, None), (looping, 0, "Bash"), (msgs, 50, "*")]
    for history, max_calls, tool in cases:
        found = check_fn(history, threshold=3, window=5, max_tool_calls=max_calls)
        assert (found.tool if found else None) == tool
        best = float("inf")
        for _ in range(20):
            t0 = time.thread_time()
            check_fn(history, threshold=3, window=5, max_tool_calls=max_calls)
            best = min(best, time.thread_time() - t0)
        # Typically ~10-100 us of CPU: the bound, 200x beyond, only catches an accidental walk-and-serialise of
        # everything. The thread's CPU time, best of 20: other processes on a loaded machine cannot inflate it.
        assert best < 0.020, f"{wire} max={max_calls}: {best * 1e3:.2f} ms"
