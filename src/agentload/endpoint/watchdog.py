"""The phase-aware stall watchdog: the chat client's ``StallPolicy`` that waits as long as the server's own signals
say a request is still on its way, and gives up fast when the server is gone (docs/background.md §8).

One "no byte for N minutes" timer makes two mistakes: it kills agents while a server is still loading its weights,
and it takes N minutes to notice a dead one. The watchdog separates the questions.

*How long should this phase take?* (the prediction)
    CONNECT (until the status line) ``connect_s``; IDLE (between tokens) ``idle_s``; FIRST_TOKEN is predicted
    from the request: ``max(floor, slack × (queue_s + uncached_tokens × s_per_token))``. ``s_per_token`` and
    ``queue_s`` are learned from finished requests (TTFT ÷ uncached prompt tokens for long prompts, TTFT of short
    ones), ``uncached_tokens`` is the prompt-token hint times the share not served from cache seen so far.

*Past the prediction, is there a reason to wait longer?* (the server's signals, from a ``SignalPoller``)
    - the server is warming up: /health answers "not ready" and it has not been ready since it came up → wait, up
      to ``warmup_cap_s`` (a 15-minute cold start is the target; the default cap is 30 minutes);
    - before the first token, the server says requests are queued or running (``waiting`` / ``running`` / busy
      llama.cpp slots) → this one may be among them (a long chunked prefill sends a role chunk and then nothing),
      so wait, up to ``queue_cap_s`` and only while the engine's token counters keep growing (flat for
      ``stuck_s`` while "busy" means a wedged engine);
    - between tokens, the server's preemption counter grew since the last token → the request may have been
      preempted and is recomputing its prefill, so wait, up to ``idle_cap_s``;
    - otherwise (ready, idle, or nothing to go on) → give up: the request is not in the server.

*Is the server there at all?* (the dead-server rule)
    No progress on the request AND no answer of any kind to the poller for ``dead_after_s`` → give up, whatever
    the prediction. So that this is noticed even while a long prediction runs, ``budget`` returns at most
    ``check_s`` and ``extend`` re-decides every ``check_s``: a request on a server that went silent at time H is
    given up by H + ``dead_after_s`` + ``check_s`` (20 + 2 = 22 s ≤ 30 s with the defaults). Refused connections
    never reach the watchdog: the transport fails at once and ``RetryingBackend`` stops resending once
    ``server_dead()`` or its attempts run out (0.5 + 1 + 2 + 4 s of backoff by default).

The client's ``extend(phase, waited)`` does not say which request it asks about, yet the prediction depends on the
request's prompt. ``budget`` is called in the request's own task just before the client arms the phase timer, and
asyncio timer callbacks run in a copy of the context current when they were scheduled, so a ``ContextVar`` set in
``budget`` carries the request's prediction to ``extend`` without any shared per-request table.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentload.clock import Clock, RealClock
from agentload.endpoint import wire
from agentload.endpoint.client import Phase
from agentload.endpoint.records import RequestRecord
from agentload.endpoint.signals import ServerSignals


class SignalSource(Protocol):
    """What the watchdog reads of the server's signals (a ``SignalPoller``; a fake in tests)."""

    @property
    def last_answer(self) -> ServerSignals | None: ...

    def last_response_age(self) -> float: ...

    def at(self, t: float) -> ServerSignals | None: ...


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """A rough prompt size for a chat body before the server counts it: characters ÷ 4 of messages and tools (as
    compact JSON, encoded with the body's own encoder: this runs every turn, over the whole conversation)."""
    parts = [body.get("messages") or body.get("prompt") or "", body.get("tools") or ""]
    return len(wire.dumps(parts).decode()) // 4


@dataclass
class _Watch:
    """One request's predictions, set by ``budget`` in the request's task and read by ``extend`` in its timers."""

    prompt_tokens: int = 0
    predicted: dict[Phase, float] = field(default_factory=dict)


_current: ContextVar[_Watch] = ContextVar("agentload_watchdog_request")

# How long after a warm-up ends a request that waited through it may still be on its way into the engine.
JUST_READY_S = 5.0
# Learning: EWMA weight of a new sample, and the prompt size above which TTFT is taken to be mostly prefill.
_ALPHA = 0.2
_LONG_PROMPT = 256


@dataclass
class WatchdogStatistics:
    """What the watchdog decided and what it has learned, for reports and tests."""

    granted: dict[str, int]
    refused: dict[str, int]
    observed: int
    prefill_tok_s: float
    queue_s: float
    cached_share: float | None


class Watchdog:
    """A ``StallPolicy`` with predicted deadlines, extended by the server's own signals; see the module docstring."""

    def __init__(
        self,
        *,
        signals: SignalSource | None = None,
        connect_s: float = 10.0,
        first_token_floor_s: float = 30.0,
        idle_s: float = 60.0,
        total_s: float = 3600.0,
        check_s: float = 2.0,
        dead_after_s: float = 20.0,
        warmup_cap_s: float = 1800.0,
        queue_cap_s: float = 1800.0,
        idle_cap_s: float = 600.0,
        stuck_s: float = 600.0,
        prefill_tok_s: float = 500.0,
        slack: float = 3.0,
        clock: Clock | None = None,
    ) -> None:
        if min(connect_s, first_token_floor_s, idle_s, total_s, check_s, dead_after_s, prefill_tok_s) <= 0:
            raise ValueError("deadlines, check_s, dead_after_s and prefill_tok_s must be positive")
        self.signals = signals
        self.connect_s = connect_s
        self.first_token_floor_s = first_token_floor_s
        self.idle_s = idle_s
        self.total_s = total_s
        self.check_s = check_s
        self.dead_after_s = dead_after_s
        self.warmup_cap_s = warmup_cap_s
        self.queue_cap_s = queue_cap_s
        self.idle_cap_s = idle_cap_s
        self.stuck_s = stuck_s
        self.slack = slack
        self.clock: Clock = clock or RealClock()
        # Before any request finished, an assumed prefill rate (a slow local GPU's); replaced by measurements.
        self._s_per_token = 1.0 / prefill_tok_s
        self._queue_s = 0.0
        self._cached_share: float | None = None
        self._observed = 0
        self._granted: dict[str, int] = {}
        self._refused: dict[str, int] = {}

    # -- StallPolicy -------------------------------------------------------------------------------------------
    def budget(self, phase: Phase, prompt_tokens: int) -> float:
        if phase is Phase.CONNECT or _current.get(None) is None:
            # CONNECT is the first phase of every request: a fresh watch, so a retry never inherits a prediction.
            _current.set(_Watch(prompt_tokens=prompt_tokens))
        watch = _current.get()
        predicted = self.predict(phase, prompt_tokens)
        watch.predicted[phase] = predicted
        if self.signals is None:
            return predicted  # nothing to re-check against: a plain predicted deadline
        return min(predicted, self.check_s)

    def extend(self, phase: Phase, waited: float) -> float | None:
        watch = _current.get(None)
        predicted = watch.predicted.get(phase) if watch is not None else None
        if predicted is None:
            predicted = self.predict(phase, 0)
        if self.signals is None:
            return predicted - waited if waited < predicted else self._refuse("predicted")
        if self.server_dead():
            return self._refuse("dead_server")
        if waited < predicted:
            return self._grant("predicted", min(self.check_s, predicted - waited))
        return self._past_prediction(phase, waited, self.signals)

    def observe(self, record: RequestRecord) -> None:
        """Learn the prefill rate, queue wait and cached share from a finished request."""
        ttft = record.ttft
        if not record.ok or ttft is None or record.prompt_tokens <= 0:
            return
        self._observed += 1
        cached = record.cached_tokens
        if cached is not None:
            share = min(1.0, cached / record.prompt_tokens)
            self._cached_share = share if self._cached_share is None else _ewma(self._cached_share, share)
        uncached = record.prompt_tokens - (cached or 0)
        if uncached >= _LONG_PROMPT:
            self._s_per_token = _ewma(self._s_per_token, ttft / uncached)
        else:
            self._queue_s = _ewma(self._queue_s, ttft)

    # -- decisions ---------------------------------------------------------------------------------------------
    def predict(self, phase: Phase, prompt_tokens: int) -> float:
        """The phase's predicted duration (before any extension)."""
        if phase is Phase.CONNECT:
            return self.connect_s
        if phase is Phase.IDLE:
            return self.idle_s
        uncached = prompt_tokens * (1.0 - (self._cached_share or 0.0))
        return max(self.first_token_floor_s, self.slack * (self._queue_s + uncached * self._s_per_token))

    def server_dead(self) -> bool:
        """No answer of any kind from the server for ``dead_after_s`` (False without signals: we cannot tell)."""
        return self.signals is not None and self.signals.last_response_age() >= self.dead_after_s

    def _past_prediction(self, phase: Phase, waited: float, signals: SignalSource) -> float | None:
        sig = signals.last_answer
        if sig is None:
            # The poller has not heard from the server yet; the dead-server rule bounds this wait.
            return self._grant("awaiting_signal")
        now = self.clock.now()
        phase_start = now - waited
        if sig.warming:
            return self._grant("warming") if waited < self.warmup_cap_s else self._refuse("warmup_cap")
        if phase is not Phase.IDLE and not sig.busy and self._just_ready(now, signals):
            # Ready only a moment ago: the requests held through the warm-up are on their way into the engine (a
            # front admits them after its own overhead), so a reading with nothing queued yet does not show them.
            return self._grant("just_ready")
        if sig.t <= phase_start:
            # The freshest reading predates this phase (a prediction shorter than the poll interval): it cannot
            # show this request yet, so wait one check for a reading that can. A silent server ends this via
            # the dead-server rule.
            return self._grant("awaiting_signal")
        if phase is Phase.IDLE:
            before = signals.at(phase_start)
            preempted = (
                before is not None
                and sig.preemptions is not None
                and before.preemptions is not None
                and sig.preemptions > before.preemptions
            )
            if preempted:
                return self._grant("preempted") if waited < self.idle_cap_s else self._refuse("idle_cap")
            # An overloaded engine (requests waiting) whose token counters moved during this silence is slow, not
            # dead: vLLM's CPU build past the KV cliff, re-prefilling 4k-token prompts at a few hundred tokens/s,
            # left streams silent for 70-210 s (seen in the tier) — cutting them off turns a measured slowdown
            # into failed turns the server still counted.
            if (sig.waiting or 0) > 0 and self._progressed_since(phase_start, sig, signals):
                return self._grant("overloaded") if waited < self.idle_cap_s else self._refuse("idle_cap")
            return self._refuse("idle")
        if sig.busy:
            if waited >= self.queue_cap_s:
                return self._refuse("queue_cap")
            if self._stuck(sig, now, signals):
                return self._refuse("stuck")
            return self._grant("queued")
        return self._refuse("not_in_server")

    def _just_ready(self, now: float, signals: SignalSource) -> bool:
        """The server was still warming up ``JUST_READY_S`` ago."""
        was = signals.at(now - JUST_READY_S)
        return was is not None and was.warming

    @staticmethod
    def _progressed_since(t: float, sig: ServerSignals, signals: SignalSource) -> bool:
        before = signals.at(t)
        if before is None or before.progress is None or sig.progress is None:
            return False
        return sig.progress > before.progress

    def _stuck(self, sig: ServerSignals, now: float, signals: SignalSource) -> bool:
        """The engine says it is busy but its token counters have not moved for ``stuck_s``."""
        before = signals.at(now - self.stuck_s)
        if before is None or before.progress is None or sig.progress is None:
            return False
        return sig.progress <= before.progress

    def _grant(self, reason: str, seconds: float | None = None) -> float:
        self._granted[reason] = self._granted.get(reason, 0) + 1
        return self.check_s if seconds is None else max(seconds, 1e-3)

    def _refuse(self, reason: str) -> float | None:
        """Count a refusal; always None (typed as extend's answer so callers can return it)."""
        self._refused[reason] = self._refused.get(reason, 0) + 1
        return None

    def statistics(self) -> WatchdogStatistics:
        return WatchdogStatistics(
            granted=dict(self._granted),
            refused=dict(self._refused),
            observed=self._observed,
            prefill_tok_s=1.0 / self._s_per_token,
            queue_s=self._queue_s,
            cached_share=self._cached_share,
        )


def _ewma(old: float, new: float) -> float:
    return (1.0 - _ALPHA) * old + _ALPHA * new
