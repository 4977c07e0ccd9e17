"""Drift detection: the verdict over a provider+model's rolling window, answer figures, and the manager's
demotion with its cooldown (injected clock)."""

from __future__ import annotations

from types import SimpleNamespace

from coderouterd.quality.drift import AnswerStats, DriftDetector, DriftSample, DriftSettings, Verdict, judge
from coderouterd.quality.drift_actions import DriftManager

CFG = DriftSettings(window=12, recent=4, min_fill=8)
GOOD = DriftSample(length=900, digest=1, tools_offered=True, tool_called=True)


def good(i: int) -> DriftSample:
    return DriftSample(length=900 + i, digest=i + 100, tools_offered=True, tool_called=True)


def test_no_verdict_before_min_fill():
    assert not judge([DriftSample()] * 7, CFG).drifting


def test_healthy_window_has_no_signal():
    v = judge([good(i) for i in range(12)], CFG)
    assert not v.drifting and v.score < 0.6


def test_empty_answers():
    v = judge([good(i) for i in range(8)] + [DriftSample()] * 3 + [good(9)], CFG)
    assert v.signals == {"empty": 0.75} and v.score == 1.0


def test_repetition_by_looping_lines_and_by_the_same_answer():
    loops = [DriftSample(length=500, repetition=0.9, digest=i) for i in range(4)]
    assert "repetition" in judge([good(i) for i in range(8)] + loops, CFG).signals
    same = [DriftSample(length=500, digest=7)] * 4
    assert "repetition" in judge([good(i) for i in range(8)] + same, CFG).signals


def test_length_collapse_against_its_own_median():
    short = [DriftSample(length=40, digest=i, tools_offered=True, tool_called=True) for i in range(4)]
    assert "length_collapse" in judge([good(i) for i in range(8)] + short, CFG).signals
    medium = [DriftSample(length=600, digest=i, tools_offered=True, tool_called=True) for i in range(4)]
    assert not judge([good(i) for i in range(8)] + medium, CFG).drifting


def test_tool_silence_only_after_the_model_used_tools():
    silent = [DriftSample(length=900, digest=i, tools_offered=True) for i in range(4)]
    assert "tool_silence" in judge([good(i) for i in range(8)] + silent, CFG).signals
    never = [DriftSample(length=900, digest=i + 50, tools_offered=True) for i in range(8)]
    assert not judge(never + silent, CFG).drifting


def test_length_stops_and_errors():
    stops = [DriftSample(length=900, digest=i, length_stop=True, tools_offered=True, tool_called=True)
             for i in range(4)]
    assert "length_stops" in judge([good(i) for i in range(8)] + stops, CFG).signals
    # Errors are errors, not drift (issue 43, E6): a window of failures says nothing about the answers.
    failing = [good(i) for i in range(8)] + [DriftSample(error=True)] * 5 + [good(1)]
    assert not judge(failing, CFG).drifting and judge(failing, CFG).samples == 9


def test_detector_reports_detected_then_recovered():
    d = DriftDetector(CFG)
    changes = [d.observe("p", "m", good(i)) for i in range(8)]
    changes += [d.observe("p", "m", DriftSample()) for _ in range(4)]
    assert changes.count("detected") == 1 and changes[-1] is None
    assert d.snapshot("p")["signals"]["empty"] >= 0.6
    changes = [d.observe("p", "m", good(i)) for i in range(4)]
    assert "recovered" in changes and not d.snapshot("p")["signals"]
    d.reset("p")
    assert d.snapshot("p")["samples"] == 0


def test_answer_stats_repetition():
    a = AnswerStats()
    for _ in range(20):
        a.text("I will check the file again.\n")
    assert a.repetition() > 0.9
    b = AnswerStats()
    b.text("\n".join(f"line {i}: a different thought" for i in range(20)))
    assert b.repetition() == 0.0
    c = AnswerStats()
    c.text("go on " * 60)
    assert c.repetition() > 0.9
    s = a.sample(tools_offered=False)
    assert s.length == 29 * 20 and not s.empty and s.repetition > 0.9


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_demotion_lasts_the_cooldown_and_is_shown_as_a_note():
    events: list = []
    clock = Clock()
    m = DriftManager(lambda: None, publish=events.append, clock=clock)
    m.detector.settings = CFG
    m.cooldown_s = 60
    for i in range(8):
        m._observe("local", "m", good(i), "demote")
    for _ in range(3):
        m._observe("local", "m", DriftSample(), "demote")
    kinds = [e.kind for e in events]
    assert kinds == ["drift_detected", "drift_action"] and events[1].action == "demote"
    profile = SimpleNamespace(drift_action="demote")
    order = ["local", "cloud"]
    notes = m.adjust_order(profile, order)
    assert order == ["cloud", "local"] and "drift (empty" in notes[0]["why"]
    untouched = ["local", "cloud"]
    [note] = m.adjust_order(SimpleNamespace(drift_action="warn"), untouched)
    assert untouched[0] == "local" and note["moved"] == "none" and "drift_action=warn" in note["why"]
    m._observe("local", "m", DriftSample(), "demote")  # still drifting, inside the cooldown: no new action
    assert [e.kind for e in events].count("drift_action") == 1
    clock.t += 61
    order = ["local", "cloud"]
    [note] = m.adjust_order(profile, order)
    assert order == ["local", "cloud"] and note["moved"] == "none"  # cooldown over: another chance
    m._observe("local", "m", DriftSample(), "demote")
    assert [e.kind for e in events].count("drift_action") == 2
    for i in range(4):
        m._observe("local", "m", good(i), "demote")
    assert events[-1].kind == "drift_recovered" and "local" not in m.demoted_until
    assert m.adjust_order(profile, ["local", "cloud"]) == []


def test_a_model_reload_yields_to_a_recovery_in_progress():
    import asyncio

    from coderouterd.health.selfheal import SelfHealer

    healer = SelfHealer.__new__(SelfHealer)  # only the recovery registry matters here
    healer._recovering = {}

    async def scenario():
        async with healer.hold("local", "drift: reloading m") as free:
            assert free
        healer._recovering["local"] = asyncio.get_running_loop().create_future()  # a recovery in progress
        async with healer.hold("local", "drift") as free:
            assert not free

    asyncio.run(scenario())


# -- bounds: models are whatever clients name (pass-through providers), so the key space is bounded ----------


def test_memory_per_provider_is_bounded_whatever_model_names_clients_send():
    """300 unique 1 MB model names (what a pass-through provider sees from a hostile client) leave at most
    MAX_MODELS windows with bounded keys: a few hundred KB, not 300 MB."""
    import tracemalloc

    from coderouterd.quality.drift import MAX_MODEL_KEY, MAX_MODELS

    d = DriftDetector(CFG)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(300):
        name = f"{i:04d}" + "m" * 1_000_000
        d.observe("p", name, good(i))
        del name
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert kept < 2_000_000, kept
    assert len(d.models("p")) == MAX_MODELS
    assert all(len(m) <= MAX_MODEL_KEY for m in d.models("p"))
    # the most recent stay (least recently used go first), and a long name still finds its own window
    last = "0299" + "m" * 1_000_000
    assert d.verdict("p", last).samples == 1
    assert d.verdict("p", "0000" + "m" * 1_000_000).samples == 0
    assert d.snapshot("p")["samples"] == 1 and len(d.snapshot("p")["model"]) <= MAX_MODEL_KEY


def test_long_names_that_differ_only_at_the_end_keep_separate_windows():
    d = DriftDetector(CFG)
    a, b = "x" * 5000 + "a", "x" * 5000 + "b"
    for i in range(3):
        d.observe("p", a, good(i))
    d.observe("p", b, good(9))
    assert d.verdict("p", a).samples == 3 and d.verdict("p", b).samples == 1


def test_lru_keeps_a_busy_model_among_many_one_off_names():
    from coderouterd.quality.drift import MAX_MODELS

    d = DriftDetector(CFG)
    for i in range(MAX_MODELS * 5):
        d.observe("p", "busy", good(i))
        d.observe("p", f"one-off-{i}", good(i))
        d.observe("q", f"other-{i}", good(i))  # another provider's names do not push p's out
    assert d.verdict("p", "busy").samples == CFG.window
    assert len(d.models("p")) == MAX_MODELS and len(d.models("q")) == MAX_MODELS


def test_drift_events_carry_a_bounded_model_name():
    events: list = []
    m = DriftManager(lambda: None, publish=events.append, clock=Clock())
    m.detector.settings = CFG
    huge = "m" * 1_000_000
    for i in range(8):
        m._observe("local", huge, good(i), "warn")
    for _ in range(3):
        m._observe("local", huge, DriftSample(), "warn")
    assert [e.kind for e in events] == ["drift_detected"]
    assert len(events[0].model) <= 256


def test_the_same_short_answer_to_different_questions_is_no_loop_to_the_same_question_it_is():
    def answer(text: str, asked: int) -> DriftSample:
        a = AnswerStats()
        a.text(text)
        return a.sample(tools_offered=False, prompt_key=asked)

    different = [answer("Done.", asked=i) for i in range(4)]  # "Done." to four different requests
    assert "repetition" not in judge([good(i) for i in range(8)] + different, CFG).signals
    same = [answer("Done.", asked=42) for _ in range(4)]  # the same request answered the same, again and again
    assert "repetition" in judge([good(i) for i in range(8)] + same, CFG).signals


# -- what is not drift (issue 34, item 6) ------------------------------------------------------------------


def test_a_length_stop_at_the_clients_own_max_tokens_is_not_drift():
    from coderouterd.translate.answer_stats import client_limit, without_client_cut

    cut = DriftSample(length=50, length_stop=True)
    assert client_limit({"max_tokens": 64}) == 64 and client_limit({"max_output_tokens": 9}) == 9
    assert client_limit({"max_tokens": True}) is None and client_limit({}) is None
    assert not without_client_cut(cut, 64, 64).length_stop  # the client's limit reached: asked for
    assert not without_client_cut(cut, 64, 0).length_stop  # no count reported: doubt spares the server
    assert without_client_cut(cut, 64, 20).length_stop  # cut short of the client's limit: the server's doing
    assert without_client_cut(cut, None, 20).length_stop  # no limit asked: the server's doing


def _served_length(completion_tokens: int, max_tokens: int) -> DriftSample:
    """A whole OpenAI answer cut at `length` with this many completion tokens, through the real executor and the
    real translation strategy (which reads the answer's finish and usage)."""
    import asyncio

    import orjson

    from tests.support.routing import FakeCall, Routing, chain_config, ok

    class ReadingCall(FakeCall):
        async def result(self) -> bytes:
            return self.strategy.response(b"".join(self._chunks))

    r = Routing(chain_config("local", extra_profile='drift_action = "warn"'))
    answer = {"id": "x", "object": "chat.completion", "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "part of an answer"},
                           "finish_reason": "length"}],
              "usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens}}
    r.ups.script("local", ok(orjson.dumps(answer)))
    r.ups.call_class = ReadingCall
    body = {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    ex, _ = asyncio.run(r.serve(body, ingress="openai"))
    assert ex.record.drift_sample is not None
    return ex.record.drift_sample


def test_the_executor_spares_a_cut_the_client_asked_for():
    assert not _served_length(64, 64).length_stop
    assert _served_length(12, 64).length_stop


def test_failed_attempts_are_errors_not_drift_and_never_filed_under_the_server_that_served():
    """Issue 43, E6: a local provider answering plain 500s fired drift, filed under the model of the provider that
    finally served. Failed attempts are no samples now; the served answer is filed under its own attempt's model."""
    from coderouterd.routing.attempts import Attempt, Outcome

    local = SimpleNamespace(cfg=SimpleNamespace(is_local=lambda: True, model="local-model"))
    backup = SimpleNamespace(cfg=SimpleNamespace(is_local=lambda: True, model="backup-model"))

    def record(reason: str, status: int, served: bool, i: int = 0) -> SimpleNamespace:
        return SimpleNamespace(profile=SimpleNamespace(drift_action="warn"),
                               model_used="backup-model" if served else None,
                               drift_sample=good(i) if served else None, served_by="backup" if served else None,
                               runtime=SimpleNamespace(providers={"local": local, "backup": backup}),
                               attempts=[Attempt("local", Outcome.FAILED, reason, status, 1.0)])

    events: list = []
    m = DriftManager(lambda: None, publish=events.append)
    m.detector.settings = CFG
    for i in range(20):
        m.record(record("http_500", 500, served=True, i=i))
        m.record(record("context_overflow", 400, served=False))
        m.record(record("http_500", 500, served=False))
    assert m.detector.models("local") == []  # the failing server: nothing filed at all
    assert m.detector.models("backup") == ["backup-model"]  # the served answers, under the served model
    assert not m.detector.verdict("backup", "backup-model").drifting
    assert events == [] and m.drifting == {}


def _judge_by_definition(samples: list[DriftSample], cfg: DriftSettings) -> Verdict:
    """The verdict spelled out sample by sample, as `judge` computed it before it was made cheaper (issue 36):
    the fast `judge` must agree with it on every window."""
    import statistics

    samples = [s for s in samples if not s.error]  # errors are not drift (issue 43, E6)
    n = len(samples)
    if n < max(cfg.min_fill, cfg.recent + 1):
        return Verdict(samples=n)
    split = n - cfg.recent
    empty = looping = length_stops = 0
    digests, ok_before, ok_recent = [], [], []
    offered_before = used_before = offered_recent = used_recent = 0
    for i, s in enumerate(samples):
        if i >= split:
            empty += s.empty
            looping += s.repetition >= cfg.repetition_level
            length_stops += s.length_stop
            if s.length:
                digests.append(s.digest)
                ok_recent.append(s.length)
            if s.tools_offered:
                offered_recent += 1
                used_recent += s.tool_called
        else:
            if s.length:
                ok_before.append(s.length)
            if s.tools_offered:
                offered_before += 1
                used_before += s.tool_called
    r = cfg.recent
    values = {"empty": (empty / r, cfg.empty_rate), "length_stops": (length_stops / r, cfg.length_stop_rate)}
    repeats = len(digests) - len(set(digests))
    values["repetition"] = (max(looping / r, (repeats + 1) / r if repeats else 0.0), cfg.repetition_rate)
    if len(ok_before) >= r and len(ok_recent) >= max(2, r // 2):
        base = statistics.median(ok_before)
        if base >= cfg.collapse_min_chars:
            values["length_collapse"] = (1 - statistics.median(ok_recent) / base, 1 - cfg.collapse_ratio)
    if offered_before >= cfg.tool_silence_min and offered_recent >= cfg.tool_silence_min:
        if used_before / offered_before >= cfg.tool_rate_before:
            values["tool_silence"] = (1 - used_recent / offered_recent, 1.0)
    fired = {k: round(v, 3) for k, (v, t) in values.items() if v >= t and v > 0}
    score = max((min(1.0, v / t) for v, t in values.values() if t > 0), default=0.0)
    return Verdict(signals=fired, score=round(score, 3), samples=n)


def test_judge_agrees_with_its_definition_on_random_windows():
    import random

    rng = random.Random(36)
    for cfg in (CFG, DriftSettings()):
        for _ in range(1500):
            window = [DriftSample(length=rng.choice((0, 0, 5, 150, 900, 2000)), repetition=rng.choice((0.0, 0.3, 0.7)),
                                  digest=rng.randrange(3), tools_offered=rng.random() < 0.6,
                                  tool_called=rng.random() < 0.5, length_stop=rng.random() < 0.2,
                                  error=rng.random() < 0.15)
                      for _ in range(rng.randrange(cfg.window + 1))]
            assert judge(window, cfg) == _judge_by_definition(window, cfg), window


def test_detector_verdicts_kept_one_answer_at_a_time_agree_with_the_whole_window():
    """The detector keeps the earlier answers' figures as answers move through the window, also across a change
    of `recent` (a settings reload keeps the windows): every verdict equals the one over the whole window."""
    import random

    rng = random.Random(7)
    for window, recent, later_recent in ((12, 4, 6), (20, 5, 3), (6, 5, 2)):
        det = DriftDetector(DriftSettings(window=window, recent=recent, min_fill=min(8, window)))
        for i in range(400):
            if i == 200:
                det.settings = DriftSettings(window=window, recent=later_recent, min_fill=min(8, window))
            s = DriftSample(length=rng.choice((0, 0, 5, 150, 900, 2000)), repetition=rng.choice((0.0, 0.7)),
                            digest=rng.randrange(3), tools_offered=rng.random() < 0.6, tool_called=rng.random() < 0.5,
                            length_stop=rng.random() < 0.2, error=rng.random() < 0.15)
            det.observe("p", "m", s)
            if s.error:  # no sample: the window and its standing verdict stay as they were (issue 43, E6)
                continue
            track = det._tracks["p"]["m"]
            assert det.verdict("p", "m") == _judge_by_definition(list(track.window), det.settings)
