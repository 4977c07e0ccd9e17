"""Acting on drift: feeds each finished request of a local provider to the detector, and on a verdict warns
(audit + log), demotes the provider in the profile's order for a cooldown, or reloads its model through the
model control API (Ollama, LM Studio), asking the self-healer to restart the backend when it cannot.

The routing side is one function, `adjust_order`, that the router consults after planning."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..state.events import DriftAction, DriftDetected, DriftRecovered
from .drift import DriftDetector, DriftSample, DriftSettings, model_key

if TYPE_CHECKING:
    from ..config.schema import ConfigModel
    from ..routing.record import RequestRecord

log = logging.getLogger("coderouterd")


def settings_from(cfg: ConfigModel) -> DriftSettings:
    d = cfg.drift
    return DriftSettings(window=d.window, recent=d.recent, min_fill=d.min_fill, empty_rate=d.empty_rate,
                         repetition_rate=d.repetition_rate, collapse_ratio=d.collapse_ratio,
                         length_stop_rate=d.length_stop_rate)


class DriftManager:
    def __init__(self, runtime: Callable, *, healer: Callable = lambda: None, publish: Callable | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`runtime()`: the live config (providers); `healer()`: the self-healer, once it exists (it is built
        after the first request can arrive, see Daemon._start_background)."""
        self._runtime = runtime
        self._healer = healer
        self.publish = publish
        self.clock = clock
        current = runtime()
        cfg = current.config if current is not None else None
        self.detector = DriftDetector(settings_from(cfg) if cfg is not None else None)
        self.cooldown_s = cfg.drift.cooldown_s if cfg is not None else 300.0
        self.demoted_until: dict[str, float] = {}  # provider -> monotonic deadline
        self.drifting: dict[str, str] = {}  # provider -> its signals, as shown in notes
        self._drift_signals: dict[str, dict[str, float]] = {}  # provider -> the signals `drifting` words
        self._last_action: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()

    def reconfigure(self, cfg: ConfigModel) -> None:
        self.detector.settings = settings_from(cfg)
        self.cooldown_s = cfg.drift.cooldown_s

    # -- samples --------------------------------------------------------------------------------------------

    def record(self, record: RequestRecord) -> None:
        """After a request, from its record (on the event loop; pure bookkeeping, no I/O): the served answer's
        sample, filed under the model of the attempt that served it. A failed attempt is no sample: errors are
        counted as errors (breaker, adaptive routing, the journal), not as drift (issue 43, E6)."""
        action = record.profile.drift_action
        if action == "off":
            return
        sample = record.drift_sample
        if sample is not None and record.served_by and not sample.error:
            self._observe(record.served_by, record.model_used or "", sample, action)

    def _observe(self, provider: str, model: str, sample: DriftSample, action: str) -> None:
        model = model_key(model)  # a client's name, bounded: it is kept, logged and journaled
        change, verdict = self.detector.observe_judged(provider, model, sample)
        if change == "recovered":
            self.demoted_until.pop(provider, None)
            self.drifting.pop(provider, None)
            self._emit(DriftRecovered(provider=provider, model=model))
            log.info("drift: %s (%s) recovered", provider, model)
            return
        if verdict.drifting:
            # While a provider drifts, every answer judges it again, nearly always with the same signals: their
            # words are formatted only when the signals change.
            words = self.drifting.get(provider)
            if words is None or self._drift_signals.get(provider) != verdict.signals:
                self.drifting[provider] = ", ".join(f"{k} {v:g}" for k, v in verdict.signals.items())
                self._drift_signals[provider] = verdict.signals
        if change == "detected":
            self._emit(DriftDetected(provider=provider, model=model, score=verdict.score,
                                     signals=dict(verdict.signals), action=action))
            log.warning("drift: %s (%s) drifting: %s; action %s", provider, model,
                        ", ".join(f"{k} {v:g}" for k, v in verdict.signals.items()), action)
        if verdict.drifting and action in ("demote", "reload"):
            now = self.clock()
            last = self._last_action.get(provider)
            if last is None or now - last >= self.cooldown_s:
                self._last_action[provider] = now
                if action == "demote":
                    self.demoted_until[provider] = now + max(self.cooldown_s, 1.0)
                    self._emit(DriftAction(provider=provider, model=model, action="demote",
                                           detail=f"moved to the back for {self.cooldown_s:g} s"))
                else:
                    self._spawn(self._reload(provider, model))

    # -- actions --------------------------------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload(self, provider: str, model: str) -> None:
        from ..providers.models_control import load_model, unload_model

        p = self._runtime().providers.get(provider)
        if p is None:
            return
        healer = self._healer()
        hold = (healer.hold(provider, f"drift: reloading {model}") if healer is not None
                else contextlib.nullcontext(True))
        try:
            async with hold as free:
                if not free:
                    self._emit(DriftAction(provider=provider, model=model, action="reload", ok=False,
                                           detail="self-healing is already recovering this provider"))
                    return
                await unload_model(p, model)
                await load_model(p, model)
        except Exception as e:  # ModelControlError, HTTP or connection errors: a reload must never die silently
            detail = f"{type(e).__name__}: {e}"
            self._emit(DriftAction(provider=provider, model=model, action="reload", ok=False, detail=detail))
            log.warning("drift: reloading %s on %s failed (%s); asking self-healing to restart it",
                        model, provider, detail)
            if healer is not None:
                healer.trigger(provider, f"drift: model reload failed ({detail})", restart=True)
            return
        self.detector.reset(provider, model)  # a fresh model: judge it afresh
        self.drifting.pop(provider, None)
        self._emit(DriftAction(provider=provider, model=model, action="reload", detail="unloaded and reloaded"))
        log.info("drift: reloaded %s on %s", model, provider)

    def _emit(self, event) -> None:
        if self.publish is not None:
            self.publish(event)

    # -- routing --------------------------------------------------------------------------------------------

    def adjust_order(self, profile, candidates: list[str]) -> list[dict]:
        """Move providers demoted for drift to the back of a profile whose drift_action is demote; a note for
        every drifting candidate either way (shown by `corectl explain` and `status`)."""
        if not self.drifting or profile.drift_action == "off":
            return []
        now = self.clock()
        notes, moved = [], []
        for name in candidates:
            signals = self.drifting.get(name)
            if signals is None:
                continue
            until = self.demoted_until.get(name) if profile.drift_action == "demote" else None
            if until is not None and until <= now:
                self.demoted_until.pop(name, None)  # cooldown over: give it another chance
                until = None
            if until is None:
                notes.append({"provider": name, "moved": "none",
                              "why": f"drift ({signals}) (drift_action={profile.drift_action})"})
                continue
            moved.append(name)
            notes.append({"provider": name, "moved": "back", "why": f"drift ({signals}) (drift_action=demote)"})
        if moved:
            candidates[:] = [c for c in candidates if c not in moved] + moved
        return notes

    def snapshot(self, provider: str) -> dict:
        snap = self.detector.snapshot(provider)
        until = self.demoted_until.get(provider)
        snap["demoted_for_s"] = round(until - self.clock(), 1) if until and until > self.clock() else None
        return snap

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
