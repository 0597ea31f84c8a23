"""How many agents may be live at once: the gate, and the policies that set its width.

Three ideas, kept apart (as guidellm keeps profiles and strategies): the ``AgentGate`` admits agents up to a
limit; a policy decides the limit (``FixedWidth`` for ``sequential`` and ``parallel --width N``, ``AdaptiveWidth``
for ``auto``); the ``Limiter`` joins them and keeps the history shown by ``statistics()``.

The unit is an agent *session*, not a request: a live agent holds its conversation's KV blocks while it thinks,
so the agent-specific capacity cliff (docs/background.md §1) is a count of live sessions. Agents ask the gate when they
start and again before every turn: when the limit has been narrowed below the number of live agents, the next
agents to reach a turn boundary are parked (conversation kept, next turn delayed) until there is room. Without
that a narrowed limit would wait for whole sessions to end — minutes of a server thrashing. Parked agents come
back before new agents start: their work is already paid for.

``AdaptiveWidth`` is a Gradient2 / Vegas-style controller (Netflix concurrency-limits; Envoy adaptive
concurrency; docs/background.md §8) fed by finished turns and, when available, the server's own gauges. See its
docstring for the signals and the reasons behind each constant.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import statistics as stats
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from agentload.errors import ConfigError


class Mode(StrEnum):
    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"
    AUTO = "auto"


# -- what the policies observe --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TurnSample:
    """One finished turn as the width controller sees it (all times on the runner's clock)."""

    agent: str
    sent: float  # the final attempt's send time
    done: float
    ttft: float | None  # None when no token came back
    new_tokens: int  # what an idle server with a warm cache must prefill: this prompt − (last prompt + reply)
    reusable_tokens: int  # the previous turn's prompt: what a warm prefix cache serves again (0 on a first turn)
    cached_tokens: int | None  # what the server says it served from cache (None when it does not report it)
    prev_done: float | None  # when the agent's previous turn ended; None on its first turn
    ok: bool
    overloaded: bool = False  # an attempt was refused or timed out (429, 503, stall)

    @property
    def first(self) -> bool:
        return self.prev_done is None

    @property
    def prefix_loss(self) -> float | None:
        """Share of the reusable prefix the server had to prefill again (evicted), or None when unknown."""
        if self.cached_tokens is None or self.reusable_tokens <= 0:
            return None
        return max(0.0, 1.0 - self.cached_tokens / self.reusable_tokens)


class ServerGauges(Protocol):
    """What the controller reads of the server's own state (``endpoint.signals.ServerSignals`` fits)."""

    @property
    def waiting(self) -> float | None: ...

    @property
    def kv_usage(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class GateView:
    live: int  # agents holding a slot
    queued: int  # agents waiting for one (new or parked)


class LimitChange(BaseModel):
    """One change of the width, with the evidence behind it."""

    model_config = ConfigDict(frozen=True)

    t: float  # seconds since the run (segment) started
    old: int
    new: int
    reason: str
    samples: int = 0
    ttft_ratio: float | None = None
    prefix_loss: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None


class LimiterStatistics(BaseModel):
    """The limiter's state and history: capacity is what agentload measures, so it is reported whole."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    limit: int
    min_limit: int
    max_limit: int
    live: int
    queued: int
    parked_total: int  # how many times an agent was parked at a turn boundary
    decisions: int  # decisions taken (holds included)
    history: list[LimitChange] = Field(default_factory=list)


# -- the gate -------------------------------------------------------------------------------------------------
class AgentGate:
    """Admits at most ``limit`` live agents, in priority order; the limit can move at any time."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._live: set[str] = set()
        self._queue: list[tuple[tuple[int, ...], int, asyncio.Future[None], str]] = []
        # Waiters in the queue not yet admitted nor cancelled (a cancelled one stays in the heap until popped), kept
        # as they come and go: ``view`` is read at every control tick and dashboard summary, with hundreds queued.
        self._waiting = 0
        self._seq = itertools.count()
        self.parked_total = 0

    @property
    def limit(self) -> int:
        return self._limit

    def view(self) -> GateView:
        return GateView(len(self._live), self._waiting)

    def is_live(self, agent: str) -> bool:
        return agent in self._live

    def set_limit(self, limit: int) -> None:
        self._limit = limit
        self._dispatch()

    async def enter(self, agent: str, priority: tuple[int, ...]) -> None:
        """Wait for a slot; lower ``priority`` tuples go first, ties in arrival order."""
        if agent in self._live:
            return
        if not self._queue and len(self._live) < self._limit:
            self._live.add(agent)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (priority, next(self._seq), fut, agent))
        self._waiting += 1
        self._dispatch()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.leave(agent)  # admitted in the same tick we were cancelled: give the slot back
            else:
                fut.cancel()
                self._waiting -= 1  # no longer waiting; ``_dispatch`` skips it without counting it again
            raise

    def leave(self, agent: str) -> None:
        """Give the slot back (idempotent: a parked or finished agent may leave twice)."""
        if agent in self._live:
            self._live.discard(agent)
            self._dispatch()

    def over_limit(self) -> bool:
        return len(self._live) > self._limit

    async def yield_if_over(self, agent: str, priority: tuple[int, ...]) -> bool:
        """At a turn boundary: park this agent when the gate holds more agents than the limit. True if parked."""
        if not self.over_limit() or agent not in self._live:
            return False
        self.parked_total += 1
        self._live.discard(agent)
        await self.enter(agent, priority)
        return True

    def _dispatch(self) -> None:
        while self._queue and len(self._live) < self._limit:
            _, _, fut, agent = heapq.heappop(self._queue)
            if fut.done():
                continue  # its waiter was cancelled
            self._live.add(agent)
            self._waiting -= 1
            fut.set_result(None)


# -- policies -------------------------------------------------------------------------------------------------
class WidthPolicy(Protocol):
    mode: Mode
    min_limit: int
    max_limit: int

    def initial(self) -> int: ...

    def observe(self, sample: TurnSample) -> None: ...

    def prefill_started(self, agent: str, t: float) -> None:
        """An agent's first turn in this process was sent: a full prefill the server must pay at any width."""
        ...

    def prefill_finished(self, agent: str, t: float) -> None: ...

    def decide(self, now: float, limit: int, gate: GateView, server: ServerGauges | None) -> LimitChange | None:
        """A change of the limit, or None to keep it; ``now`` is seconds since the segment started."""
        ...

    @property
    def decisions(self) -> int: ...


@dataclass
class FixedWidth:
    """``sequential`` (width 1) and ``parallel --width N``: the width never moves."""

    mode: Mode
    width: int
    decisions: int = 0

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ConfigError("the width must be at least 1")
        self.min_limit = self.max_limit = self.width

    def initial(self) -> int:
        return self.width

    def observe(self, sample: TurnSample) -> None:
        return None

    def prefill_started(self, agent: str, t: float) -> None:
        return None

    def prefill_finished(self, agent: str, t: float) -> None:
        return None

    def decide(self, now: float, limit: int, gate: GateView, server: ServerGauges | None) -> LimitChange | None:
        return None


@dataclass(frozen=True)
class AutoTuning:
    """The constants of ``AdaptiveWidth``, each with the reason for its value."""

    # Undisturbed TTFT may reach this multiple of the recent clean baseline before it counts as degradation
    # (Gradient2's tolerance is 1.5 for request RTTs). Agent turns need more: below the KV knee, agents' turns
    # that land in the same engine steps legitimately multiply each other's TTFT (laptop profile, 7.8k-token
    # agents: 0.05 s alone, 0.12-0.15 s at 7-8 agents, throughput still rising), while one agent past the knee
    # multiplies it by 6 or more (0.7-1.0 s at 9 agents, 3 s at 10).
    tolerance: float = 4.0
    # Share of the reusable prefix the server re-prefilled, above its structural floor, that means eviction:
    # below the knee it stays under a block's worth (≈0); past it, 10-60% within a round or two (laptop
    # profile, 7.8k-token agents, at 9-10 agents).
    loss_limit: float = 0.10
    # Mean requests waiting at the server: vLLM admits a waiting request within a step or two while the pool
    # has room, so a queue that stays above one request for a whole round means it no longer does.
    waiting_limit: float = 1.0
    # A queue reading taken this soon after a cold prefill ended still shows the queue that prefill built.
    settle_s: float = 2.0
    # KV usage above which the controller does not widen: one more agent's first prefill would not fit.
    kv_headroom: float = 0.90
    # Gradient2 clamps its gradient at 0.5: never cut more than half in one decision.
    backoff_floor: float = 0.5
    # Gradient2 smooths each new limit with its old one (its default 0.2 suits per-request updates; decisions
    # here are a whole agent round apart, so half the step is taken at once).
    smoothing: float = 0.5
    # Weight of each clean round in the TTFT baseline: it follows the last few clean rounds (Gradient2's long
    # average), so gradual growth below the knee is absorbed while the jump at the knee is not.
    baseline_weight: float = 0.5
    # A decision waits for fresh turns from this share of the live agents — one "round trip" in Vegas's sense,
    # since a change shows only once the agents have sent a turn under it.
    coverage: float = 0.75
    # ... or for this long, if at least one fresh turn came back (stragglers must not freeze the controller).
    max_wait_s: float = 60.0
    # After narrowing from width W, widening back to W needs this many clean rounds in a row: overshooting the
    # knee costs every live agent a full re-prefill of its context, so the cliff is re-probed sparingly. Each
    # time the same width congests again the patience doubles (up to ``max_patience``), as TCP backs off its
    # retransmissions; a width that holds clean resets it.
    patience: int = 3
    max_patience: int = 24
    # TTFT is normalised by the tokens a turn must prefill, floored: below ~256 tokens a turn's TTFT is a step
    # and the API overhead rather than prefill, and dividing by a handful of tokens would only add noise.
    norm_floor_tokens: int = 256


@dataclass(frozen=True)
class _Reading:
    """One decision window's signals (None: nothing undisturbed measured it), the evidence of its change."""

    samples: int  # fresh turns in the window
    ratio: float | None  # the median TTFT against its class baseline
    medians: dict[bool, float]  # first turn? → the window's median normalised TTFT
    loss: float | None  # mean share of reusable prefix the server re-prefilled
    waiting: float | None  # mean requests waiting at the server
    kv: float | None  # the last KV usage
    overloaded: int  # turns refused, failed or timed out

    def change(self, now: float, old: int, new: int, reason: str) -> LimitChange:
        return LimitChange(t=now, old=old, new=new, reason=reason, samples=self.samples, ttft_ratio=self.ratio,
                           prefix_loss=self.loss, waiting=self.waiting, kv_usage=self.kv)  # fmt: skip


class AdaptiveWidth:
    """``auto``: widen while turns stay fast and the server has room, narrow when they degrade.

    Signals, per decision window (the turns sent since the last decision):

    * TTFT normalised by the tokens the turn *had to* prefill on an idle server with a warm cache (the prompt's
      growth since the agent's last turn; the whole prompt on a first turn), compared with the baseline of
      recent clean windows, separately for first and later turns. Normalising by the *actual* uncached tokens
      would hide the cliff: an evicted prefix inflates both TTFT and the uncached count, so their ratio stays
      flat exactly when the server starts thrashing.
    * Prefix loss: the share of the previous prompt the server did not serve from cache (usage's
      ``cached_tokens``) — eviction seen directly, above its floor (templates that never cache well).
    * The server's ``num_requests_waiting`` (mean over the window) and KV usage, when a poller provides them.
    * Refused or timed-out attempts (429, 503, stalls).

    TTFT and the queue are read only while no cold prefill is in flight (``prefill_started`` / ``_finished``:
    an agent's first turn, its first after a restart or after being parked). A cold turn prefills a whole
    context (seconds on a small GPU) and every turn scheduled meanwhile waits behind it; the server pays that
    once per agent at any width, so it says nothing about whether the width is too high (measured on the laptop
    profile: each wave of new agents multiplied TTFT 5–15× with no eviction at all). Prefix loss and refusals
    are read always: eviction and 429s are the width's fault whenever they happen.

    Each signal gives a gradient in [0.5, 1] (TTFT: Gradient2's ``tolerance × baseline / sample``; loss:
    ``1 − excess``; waiting: Vegas's ``L / (L + queue)``); the smallest wins. Below 1 the limit moves toward
    ``L × gradient`` (smoothed, at least one agent, never under ``min_limit``); at 1 it grows by one agent when
    agents are queued for a slot and KV has headroom. One agent per step is the unit of a session's KV
    footprint; growing by √L like Envoy would jump over a cliff that is one agent wide.

    Staleness: a window counts turns *sent* after the last decision. After a decrease it also requires the
    agent's previous turn to have ended after it — an agent evicted before the decrease shows the loss on its
    next turn, which says nothing about the new, narrower limit.
    """

    mode = Mode.AUTO

    def __init__(
        self, start: int, *, min_limit: int = 1, max_limit: int = 256, tuning: AutoTuning | None = None
    ) -> None:
        if not 1 <= min_limit <= max_limit:
            raise ConfigError(f"auto width bounds must satisfy 1 ≤ min ≤ max (got {min_limit}, {max_limit})")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.start = min(max(start, min_limit), max_limit)
        self.t = tuning or AutoTuning()
        self._pending: list[TurnSample] = []
        self._gauges: list[tuple[float, float | None, float | None]] = []  # (t, waiting, kv usage)
        self._prefilling: dict[str, float] = {}  # agent → when its cold turn in flight was sent
        self._prefills: list[tuple[float, float]] = []  # finished cold turns: (sent, answered)
        self._window_start = 0.0
        self._last_decrease = -math.inf
        self._baseline: dict[bool, float] = {}  # first turn? → normalised TTFT of clean windows
        self._loss_floor: float | None = None
        self._ceiling: int | None = None  # the width that last congested
        self._clean_streak = 0
        self._patience = self.t.patience
        self._decisions = 0

    @property
    def decisions(self) -> int:
        return self._decisions

    def initial(self) -> int:
        return self.start

    def observe(self, sample: TurnSample) -> None:
        self._pending.append(sample)

    def prefill_started(self, agent: str, t: float) -> None:
        self._prefilling[agent] = t

    def prefill_finished(self, agent: str, t: float) -> None:
        start = self._prefilling.pop(agent, None)
        if start is not None:
            self._prefills.append((start, t))

    def _disturbed(self, t0: float, t1: float) -> bool:
        """Did any agent's cold prefill overlap [t0, t1]?"""
        if any(s <= t1 for s in self._prefilling.values()):
            return True
        return any(s <= t1 and e >= t0 for s, e in self._prefills)

    def _norm(self, s: TurnSample) -> float | None:
        if s.ttft is None or not s.ok:
            return None
        return s.ttft / max(s.new_tokens, self.t.norm_floor_tokens)

    def _fresh(self, s: TurnSample) -> bool:
        if s.sent < self._window_start:
            return False
        return s.prev_done is None or s.prev_done >= self._last_decrease

    def decide(self, now: float, limit: int, gate: GateView, server: ServerGauges | None) -> LimitChange | None:
        if server is not None:
            self._gauges.append((now, server.waiting, server.kv_usage))
        self._pending = [s for s in self._pending if s.sent >= self._window_start]
        fresh = [s for s in self._pending if self._fresh(s)]
        agents = {s.agent for s in fresh}
        need = max(1, math.ceil(self.t.coverage * max(gate.live, 1)))
        waited = now - self._window_start
        if len(agents) < need and not (fresh and waited >= self.t.max_wait_s):
            return None
        change = self._decide(now, limit, gate, fresh)
        self._window_start = now
        self._gauges.clear()
        self._prefills = [(s, e) for s, e in self._prefills if e >= now - self.t.settle_s]
        return change

    def _decide(self, now: float, limit: int, gate: GateView, fresh: Sequence[TurnSample]) -> LimitChange | None:
        self._decisions += 1
        r = self._read(fresh)
        gradients = self._gradients(r, limit)
        if gradients:
            return self._narrow(now, limit, r, min(gradients))
        if r.ratio is None and r.loss is None:
            # Nothing undisturbed to judge by (every turn overlapped a cold prefill, or no baseline yet):
            # learn the baseline, but no evidence is no reason to widen.
            for first, m in r.medians.items():
                self._baseline.setdefault(first, m)
            return None
        return self._widen(now, limit, gate, r)

    def _read(self, fresh: Sequence[TurnSample]) -> _Reading:
        """The window's signals from its fresh turns and the server's gauges since the last decision."""
        t = self.t
        # TTFT: each undisturbed sample against its class baseline; the window's median ratio.
        ratios: list[float] = []
        medians: dict[bool, float] = {}
        for first in (True, False):
            values = [
                v
                for s in fresh
                if s.first is first
                and (v := self._norm(s)) is not None
                and not self._disturbed(s.sent, s.sent + (s.ttft or 0.0))
            ]
            if not values:
                continue
            medians[first] = stats.median(values)
            base = self._baseline.get(first)
            if base is not None and base > 0:
                ratios.extend(v / base for v in values)
        losses = [x for s in fresh if not s.first and (x := s.prefix_loss) is not None]
        waits = [w for at, w, _ in self._gauges if w is not None and not self._disturbed(at - t.settle_s, at)]
        kvs = [k for _, _, k in self._gauges if k is not None]
        return _Reading(
            samples=len(fresh),
            ratio=stats.median(ratios) if ratios else None,
            medians=medians,
            loss=stats.fmean(losses) if losses else None,
            waiting=stats.fmean(waits) if waits else None,
            kv=kvs[-1] if kvs else None,
            overloaded=sum(1 for s in fresh if s.overloaded or not s.ok),
        )

    def _gradients(self, r: _Reading, limit: int) -> list[tuple[float, str]]:
        """Each signal over its limit, as (the share of the width it asks to keep, why); none: no congestion."""
        t = self.t
        gradients: list[tuple[float, str]] = []
        if r.ratio is not None and r.ratio > t.tolerance:
            gradients.append((t.tolerance / r.ratio, f"TTFT {r.ratio:.1f}× its recent baseline"))
        excess = None if r.loss is None else r.loss - (self._loss_floor or 0.0)
        if excess is not None and excess > t.loss_limit:
            gradients.append((1.0 - excess, f"the server re-prefilled {r.loss:.0%} of reusable prefixes (evicted)"))
        if r.waiting is not None and r.waiting > t.waiting_limit:
            gradients.append((limit / (limit + r.waiting), f"{r.waiting:.1f} requests waiting at the server"))
        if r.overloaded:
            gradients.append((0.75, f"{r.overloaded} turns refused, failed or timed out"))
        return gradients

    def _narrow(self, now: float, limit: int, r: _Reading, worst: tuple[float, str]) -> LimitChange | None:
        """Narrow by the worst signal's gradient (smoothed, floored); the width it congested at becomes the ceiling."""
        t = self.t
        gradient, why = worst
        gradient = max(gradient, t.backoff_floor)
        target = limit - t.smoothing * (limit - limit * gradient)
        new = max(self.min_limit, min(limit - 1, math.floor(target)))
        if self._ceiling is not None and limit >= self._ceiling:
            self._patience = min(2 * self._patience, t.max_patience)
        self._ceiling = limit
        self._clean_streak = 0
        if new == limit:
            return None
        self._last_decrease = now
        return r.change(now, limit, new, f"narrow: {why}")

    def _widen(self, now: float, limit: int, gate: GateView, r: _Reading) -> LimitChange | None:
        """A clean window: learn from it, and widen by one where agents queue and nothing holds the width back."""
        t = self.t
        self._clean_streak += 1
        for first, m in r.medians.items():
            old = self._baseline.get(first)
            self._baseline[first] = m if old is None else old + t.baseline_weight * (m - old)
        if r.loss is not None:
            self._loss_floor = r.loss if self._loss_floor is None else min(self._loss_floor, r.loss)
        roomy = r.kv is None or r.kv < t.kv_headroom
        if self._ceiling is not None and limit >= self._ceiling and self._clean_streak >= self._patience:
            self._ceiling, self._patience = None, t.patience  # the width that once congested holds now
        cautious = self._ceiling is not None and limit + 1 >= self._ceiling and self._clean_streak < self._patience
        if gate.queued == 0 or limit >= self.max_limit or not roomy or cautious:
            return None
        signals = [f"{r.samples} turns clean"]
        if r.ratio is not None:
            signals.append(f"TTFT {r.ratio:.1f}× baseline")
        if r.loss is not None:
            signals.append(f"prefix loss {r.loss:.0%}")
        if r.waiting is not None:
            signals.append(f"{r.waiting:.1f} waiting")
        if r.kv is not None:
            signals.append(f"KV {r.kv:.0%}")
        self._clean_streak = 0  # the new width earns its own clean rounds (and clears a ceiling with them)
        return r.change(now, limit, limit + 1, "widen: " + ", ".join(signals))


# -- the limiter ----------------------------------------------------------------------------------------------
class Limiter:
    """A gate whose width a policy sets; ``tick`` applies the policy's decisions."""

    def __init__(self, policy: WidthPolicy) -> None:
        self.policy = policy
        self.gate = AgentGate(policy.initial())
        self.history: list[LimitChange] = []

    @property
    def mode(self) -> Mode:
        return self.policy.mode

    @property
    def limit(self) -> int:
        return self.gate.limit

    def observe(self, sample: TurnSample) -> None:
        self.policy.observe(sample)

    def prefill_started(self, agent: str, t: float) -> None:
        self.policy.prefill_started(agent, t)

    def prefill_finished(self, agent: str, t: float) -> None:
        self.policy.prefill_finished(agent, t)

    def tick(self, now: float, server: ServerGauges | None = None) -> LimitChange | None:
        change = self.policy.decide(now, self.gate.limit, self.gate.view(), server)
        if change is not None:
            self.history.append(change)
            self.gate.set_limit(change.new)
        return change

    def statistics(self) -> LimiterStatistics:
        view = self.gate.view()
        return LimiterStatistics(
            mode=self.policy.mode,
            limit=self.gate.limit,
            min_limit=self.policy.min_limit,
            max_limit=self.policy.max_limit,
            live=view.live,
            queued=view.queued,
            parked_total=self.gate.parked_total,
            decisions=self.policy.decisions,
            history=list(self.history),
        )


def make_policy(mode: Mode, width: int, *, max_width: int, min_width: int = 1) -> WidthPolicy:
    """The policy for a mode: ``width`` is the fixed width (parallel) or the starting width (auto)."""
    if mode is Mode.SEQUENTIAL:
        return FixedWidth(Mode.SEQUENTIAL, 1)
    if mode is Mode.PARALLEL:
        return FixedWidth(Mode.PARALLEL, width)
    return AdaptiveWidth(width, min_limit=min_width, max_limit=max(max_width, min_width))


def time_weighted_limit(history: Sequence[LimitChange], start_limit: int, t0: float, t1: float) -> float:
    """The mean width over [t0, t1] given the changes (each effective from its ``t``)."""
    if t1 <= t0:
        raise ValueError("empty interval")
    limit = start_limit
    for c in history:
        if c.t <= t0:
            limit = c.new
    total = 0.0
    at = t0
    for c in history:
        if t0 < c.t < t1:
            total += limit * (c.t - at)
            at, limit = c.t, c.new
    total += limit * (t1 - at)
    return total / (t1 - t0)
