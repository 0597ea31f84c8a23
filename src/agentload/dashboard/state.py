"""The dashboard's live state: accumulated from the run's events, compiled into snapshots and deltas on demand.

Nothing here feeds back into the run. The fleet reports through its ``FleetProgress`` calls (agent states, turns,
width changes), the chat client hands over each request as it is sent (``endpoint.client.stream_watch``: its
stream, and its reply when it is over), and the connection's one server monitor reports each scrape
(``SignalPoller.subscribe``: no second poller). Each change
bumps a version; a page's stream asks for what changed since the version it last saw (``delta``), so an agent
that changed ten times between two flushes is sent once (coalesced per agent), and only as much of its card as
changed, in three tiers (the page merges each into the card it has): a reply that only streamed on, its phase and
preview; a turn's progress (sent, answered, committed; a state change), those and the state, turn and token
figures; anything else (its error, a stop or restart from the page, a card the page has not seen), the whole card.

What a flush costs is O(changes since the cursor) plus O(requests in flight), never O(agents): a change appends
its card and version to a change log, so a delta walks that log back from the end only as far as the cursor's
version, sending each card once (at its latest change); the per-state counts (the header, the *live agents*
timeline) are kept as agents change state instead of being counted over every card at each flush and each scrape.

A request is not followed chunk by chunk, nor even event by event: the chat client hands its accumulator over once,
as it is sent, and ``refresh`` reads it at the page's rate — not answered yet, the phase is ``prefilling``; the
first token's arrival (text, reasoning or a tool call's) makes it ``streaming``, and the preview follows the reply:
its tool calls as their arguments stream, else the last ~200 characters of its text; once the request is over (its
record is in the accumulator) the card shows its reply and ``tool`` or ``think`` until the turn is committed. So a
turn costs the run one call as its request starts and one as it is committed; most requests start and end between
two flushes, and a page sees only the last state anyway.

Nor does the page's flush wake the loop on its own when it need not: from ``ride_at`` on, the first event the state
hears (the loop is awake for it anyway) calls ``ride``, and the flush runs then, in the same wake-up
(``dashboard.server.Flusher``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentload.agent.loop import TurnLog
from agentload.bench.results import LevelSummary
from agentload.clock import Clock
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.endpoint.scrape import MetricsSnapshot, prefix_hit_rate
from agentload.endpoint.signals import ServerSignals
from agentload.fleet.config import AgentPlan
from agentload.fleet.limiter import LimiterStatistics
from agentload.fleet.turns import AgentState, FleetProgress

PREVIEW_CHARS = 200
# How much of a card a change touches (``LiveState._bump``), so how much of it a delta sends.
STREAM, TURN, WHOLE = 0, 1, 2
# Server samples kept for the page's timelines (one a second by default: an hour); older ones are dropped.
MAX_POINTS = 3600


class StreamView(Protocol):
    """What the dashboard reads of a request in flight (``endpoint.client._Acc`` fits)."""

    t_first_token: float | None
    content: list[str]
    calls: dict[int, dict[str, str]]  # the tool calls so far, by index: their name and arguments as they stream
    record: RequestRecord | None  # set when the request is over (its reply: tool calls, text or error)


class WatchdogView(Protocol):
    """The stall watchdog's decisions so far (``endpoint.watchdog.Watchdog.statistics()`` fits)."""

    granted: dict[str, int]
    refused: dict[str, int]


@dataclass(slots=True)
class Card:
    """One agent as its card shows it."""

    id: str
    group: str
    wave: int
    depends_on: list[str]
    state: str = AgentState.WAITING.value
    phase: str = "queued"  # queued | prefilling | streaming | tool | think | "" (not live)
    turn: int = 0  # turns committed
    context: int = 0  # the last turn's prompt tokens
    out: int = 0  # completion tokens over the turns seen in this process
    ttft: float | None = None  # the last turn's time to first token, s
    preview: str = ""
    error: str = ""
    stopping: bool = False  # asked to stop from the dashboard, not stopped yet
    restarts: int = 0  # restarted from the dashboard
    v: int = 0  # the state's version when the card last changed
    vt: int = 0  # ... when its state, turn or figures last changed (a delta sends those: ``progress``)
    vf: int = 0  # ... when anything else last changed (a delta sends it whole)
    # The last reply, its preview not made yet: made once when the card is next read (an agent's reply is seen by
    # refresh and again by turn, and several can pass between two flushes; a page shows only the last).
    reply: RequestRecord | None = None

    def settle(self) -> None:
        """Make the preview of the reply kept in ``reply`` (none: nothing to do)."""
        if self.reply is not None:
            self.preview = reply_preview(self.reply) or self.preview
            self.reply = None

    def streaming(self) -> dict[str, Any]:
        """What a reply's streaming changes of the card: its phase and preview (a page merges it into the card)."""
        self.settle()
        return {"id": self.id, "phase": self.phase, "preview": self.preview}

    def progress(self) -> dict[str, Any]:
        """What a turn's progress changes of the card: the streaming fields, its state, turn and figures."""
        self.settle()
        return {
            "id": self.id,
            "state": self.state,
            "phase": self.phase,
            "turn": self.turn,
            "context": self.context,
            "out": self.out,
            "ttft": self.ttft,
            "preview": self.preview,
        }

    def public(self) -> dict[str, Any]:
        """The whole card: its progress and the fields that rarely change (a snapshot's, or a rare change's)."""
        card = self.progress()
        card.update(group=self.group, wave=self.wave, depends_on=self.depends_on, error=self.error,
                    stopping=self.stopping, restarts=self.restarts)  # fmt: skip
        return card


@dataclass
class Cursor:
    """How far one page's stream has been sent."""

    version: int = 0
    points: int = 0
    decisions: int = 0
    levels: int = 0
    steps: int = 0


@dataclass
class BenchView:
    """A bench run as the page shows it (``dashboard.bench.BenchBoard`` fills it): the level running, the levels
    measured (a row each, as its summary is compiled), and the knee search's steps."""

    meta: dict[str, Any]  # mode, target, workload, run id
    current: dict[str, Any] | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)


def level_row(s: LevelSummary) -> dict[str, Any]:
    """One row of the page's level table (``BenchView.levels``), live and in a replay."""
    hit = s.prefix_hit_rate_server if s.prefix_hit_rate_server is not None else s.prefix_hit_rate_usage
    return {
        "level": s.level,
        "agents": s.agents,
        "context": s.context,
        "workload": s.workload,
        "output_tps": s.output_tps,
        "turns": s.turns,
        "turns_per_s": s.turns_per_s,
        "ttft_p50": s.ttft_s.p50,
        "ttft_p95": s.ttft_s.p95,
        "hit": hit,
        "peak_kv": s.peak_kv_usage,
        "preemptions": s.preemptions,
        "too_few_turns": s.too_few_turns,
        "warnings": list(s.warnings),
    }


def _calls_preview(calls: Iterable[tuple[str, str]]) -> str:
    return "→ " + ", ".join(f"{name}({arguments[:60]})" for name, arguments in calls)


def reply_preview(record: RequestRecord) -> str:
    """What a card shows of a finished turn (live, and in a replay): its tool calls, its text's tail, or its error."""
    if record.tool_calls:
        return _calls_preview((c.name, c.arguments) for c in record.tool_calls)
    if record.content:
        return record.content[-PREVIEW_CHARS:]
    if not record.ok:
        return f"{record.outcome.value}: {record.error_message}"[:PREVIEW_CHARS]
    return ""


class _Watch:
    """A request in flight as ``refresh`` reads it: its accumulator, how much of its reply was seen (-1: nothing
    yet, not even that it was sent), its card, and the tail of its text so far over the ``pieces`` text pieces
    read (``text_tail``)."""

    __slots__ = ("card", "pieces", "seen", "tail", "view")

    def __init__(self, view: StreamView, card: Card) -> None:
        self.view = view
        self.card = card
        self.seen = -1
        self.pieces = 0
        self.tail = ""

    def text_tail(self) -> str:
        """The last ``PREVIEW_CHARS`` characters of the text so far. Only the pieces that arrived since the last
        read are joined: the tail of a + b is the tail of (a's tail + b), and a reply's pieces only grow, so a
        flush costs the pieces it brings, not a walk back through the reply's."""
        content = self.view.content
        n = len(content)
        if n > self.pieces:
            fresh = content[self.pieces] if n == self.pieces + 1 else "".join(content[self.pieces : n])
            self.tail = (self.tail + fresh)[-PREVIEW_CHARS:]
            self.pieces = n
        return self.tail


_ENDED = frozenset({AgentState.DONE, AgentState.FAILED, AgentState.SKIPPED, AgentState.INTERRUPTED, AgentState.STOPPED})
_QUEUED = frozenset({AgentState.WAITING, AgentState.PARKED})


class LiveState:
    """Every card, the width and its decisions, the server's gauges over time; see the module docstring."""

    def __init__(self, plans: Sequence[AgentPlan], clock: Clock, *, fleet: str = "", run_id: str = "") -> None:
        self.clock = clock
        self.t0 = clock.now()
        self.fleet = fleet
        self.run_id = run_id
        self.version = 0
        # In the plans' order (the snapshot's: the page lays its cards out in it), and least recently changed first.
        self.cards: dict[str, Card] = {
            p.agent_id: Card(p.agent_id, p.task_id, p.wave, list(p.depends_on)) for p in plans
        }
        # The change log: the card and the version of every change, in order (``_bump``; ``delta`` reads it back from
        # the end). Appending is all a change costs: moving the card in a recency list (an ``OrderedDict``) touched
        # its node and both neighbours, cold memory in a run of a thousand agents.
        self._log_v: list[int] = []
        self._log_c: list[Card] = []
        self._counts: dict[str, int] = {}  # cards by state (kept as they change; no state at 0)
        for card in self.cards.values():
            self._counts[card.state] = self._counts.get(card.state, 0) + 1
        self.limiter: LimiterStatistics | None = None
        # The run's limiter, read when a summary is built: its live and queued agents, parks and decisions move
        # between the changes of the width that ``limiter_changed`` reports (None: what that last reported).
        self.limiter_view: Callable[[], LimiterStatistics] | None = None
        self.decisions: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.dropped_points = 0
        self.watchdog: Callable[[], WatchdogView] | None = None  # read at each flush
        self.control: dict[str, Any] = {"paused": False, "stopping": False}
        self.finished = False
        self.turns = 0
        self.out_tokens = 0  # completion tokens of the turns committed in this process
        self._ttfts: list[float] = []  # TTFTs of the turns committed since the last scrape
        self._streams: dict[str, _Watch] = {}  # agent → its request in flight
        self._last_counters: tuple[float, float] | None = None  # prefix queries, hits at the last scrape
        self._preempt0: float | None = None
        self._summary_v = 0  # version of the last change outside the cards (limiter, control, points)
        self.bench: BenchView | None = None  # set for a bench run (it has levels, not a fleet's cards)
        # The page's next flush may ride on the run's own events from this time on (on ``ride_clock``, the event
        # loop's: None while no flush waits): the first event then calls ``ride``. Set by ``dashboard.server.Flusher``.
        self.ride_at: float | None = None
        self.ride: Callable[[], None] | None = None
        self.ride_clock: Callable[[], float] = clock.now

    def _awake(self) -> None:
        """An event: the loop is awake for it. A flush that may run from now on runs in this wake-up rather than wake
        an idle loop on its own timer (so the page's stream adds no wake-ups to a busy run's loop)."""
        at = self.ride_at
        if at is not None and at <= self.ride_clock():
            self.ride_at = None
            if self.ride is not None:
                self.ride()

    @property
    def in_flight(self) -> bool:
        """Requests are kept for ``refresh`` to read: the page can change with no event (their replies stream)."""
        return bool(self._streams)

    # -- events ---------------------------------------------------------------------------------------------
    def _bump(self, card: Card | None = None, tier: int = WHOLE) -> None:
        """A change: of ``card`` (of its fields in ``tier``: STREAM, TURN or WHOLE), else of the summary."""
        self.version += 1
        v = self.version
        if self.ride_at is not None:  # None during a flush (its refresh bumps) and while no page is open
            self._awake()
        if card is None:
            self._summary_v = v
            return
        card.v = v
        if tier:
            card.vt = v
            if tier == WHOLE:
                card.vf = v
        log = self._log_v
        log.append(v)
        self._log_c.append(card)
        if len(log) > 4 * len(self.cards) + 4096:
            self._compact_log()

    def _compact_log(self) -> None:
        """Keep each card's latest change only (in order): the entries a delta skips anyway, dropped for good."""
        kept = [(v, card) for v, card in zip(self._log_v, self._log_c, strict=True) if card.v == v]
        self._log_v = [v for v, _ in kept]
        self._log_c = [card for _, card in kept]

    def _card(self, agent: str) -> Card:
        card = self.cards.get(agent)
        if card is None:  # an agent the plans did not name (cannot happen in a fleet; kept rather than lost)
            card = self.cards[agent] = Card(agent, "", 0, [])
            self._counts[card.state] = self._counts.get(card.state, 0) + 1
            self._bump(card)  # a card no page has: sent whole, whatever the change that made it
        return card

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        card = self._card(agent)
        old = card.state
        if old != state:  # an AgentState is its own value (a StrEnum): kept as is, no .value lookups per event
            counts = self._counts
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
            counts[state] = counts.get(state, 0) + 1
            card.state = state
        if rounds is not None:
            card.turn = rounds
        tier = TURN
        if state in _QUEUED:
            card.phase = "queued"
        elif state in _ENDED:
            card.phase = ""
            if card.stopping:
                card.stopping = False
                tier = WHOLE
            self._streams.pop(agent, None)
        elif card.phase == "queued":
            card.phase = ""  # admitted: its request is on its way (prefilling as soon as it is sent)
        if detail:
            card.error = detail[:300]
            tier = WHOLE
        self._bump(card, tier)

    def turn(self, agent: str, turn: TurnLog) -> None:
        self._streams.pop(agent, None)  # the turn's last request: its reply is the turn's (shown from the turn)
        card = self._card(agent)
        final = turn.final
        out = sum(r.completion_tokens for r in turn.records)
        card.turn = turn.round + 1
        card.context = final.prompt_tokens
        card.out += out
        card.ttft = final.ttft
        if final.ttft is not None:
            self._ttfts.append(final.ttft)
        self.out_tokens += out
        card.reply = final  # its preview is made when the card is next sent
        card.phase = "think"  # the pause before its next turn (or its end, which agent() reports next)
        self.turns += 1
        self._bump(card, TURN)

    def limiter_changed(self, stats: LimiterStatistics) -> None:
        self.limiter = stats
        for change in stats.history[len(self.decisions) :]:
            self.decisions.append(change.model_dump(mode="json"))
        self._bump()

    def stream_started(self, ids: RequestIds | None, view: StreamView) -> None:
        """A request is sent (each attempt of a turn; ``endpoint.client.stream_watch``): kept, and read by ``refresh``
        at the page's rate — ``prefilling``, ``streaming`` from its first token, ``tool`` or ``think`` once it is
        over. Nothing else here: most requests start and end between two flushes, and a page sees only the last."""
        if ids is None or not ids.agent:
            return  # not an agent's request (a probe, the sizing): no card
        agent = ids.agent
        card = self.cards.get(agent) or self._card(agent)
        self._streams[agent] = _Watch(view, card)
        self._awake()  # the one event that changes nothing yet: its stream is read at the next flush

    def agent_control(self, agent: str, *, stopping: bool = False, restarted: bool = False) -> None:
        card = self._card(agent)
        if stopping and card.state not in _ENDED:
            card.stopping = True
        if restarted:
            card.restarts += 1
            self._streams.pop(agent, None)  # its turn in flight is cancelled, not committed: no reply to show
            card.phase = ""
        self._bump(card)

    def finish(self) -> None:
        """The run is over: a request still kept was cut short by its end (cancelled, never answered) and will not
        be committed, so its card stops showing it as in flight."""
        self.refresh()  # the replies that did arrive are shown first
        for watch in self._streams.values():
            watch.card.phase = ""
            self._bump(watch.card, STREAM)
        self._streams.clear()
        self.finished = True

    def touch(self) -> None:
        """Something outside the cards changed (a bench's level or step): the next delta carries the summary."""
        self._bump()

    def record(self, record: RequestRecord) -> None:
        """A bench request's attempt (a bench has no fleet turns): counted in the turn and token timelines."""
        if not record.ok:
            return
        self.turns += 1
        self.out_tokens += record.completion_tokens
        if record.ttft is not None:
            self._ttfts.append(record.ttft)

    def control_changed(self, **fields: Any) -> None:
        self.control.update(fields)
        self._bump()

    def on_scrape(self, sig: ServerSignals, snapshot: MetricsSnapshot | None) -> None:
        """A ``SignalPoller`` listener: one point of the server's timelines per scrape."""
        hit: float | None = None
        preemptions: float | None = None
        if snapshot is not None:
            norm = snapshot.normalised()
            q, h = norm.get("prefix_queries"), norm.get("prefix_hits")
            if q is not None and h is not None:
                if self._last_counters is not None:
                    hit = prefix_hit_rate(*self._last_counters, q, h)
                self._last_counters = (q, h)
        if sig.preemptions is not None:
            if self._preempt0 is None:
                self._preempt0 = sig.preemptions
            preemptions = sig.preemptions - self._preempt0
        live = self._counts.get(AgentState.RUNNING.value, 0)
        if self.bench is not None and self.bench.current is not None:
            live = self.bench.current["agents"]  # a bench level's agents are all live at once
        ttfts = sorted(self._ttfts)
        self._ttfts = []
        self.points.append(
            {
                "t": round(sig.t - self.t0, 3),
                "kv": sig.kv_usage,
                "running": sig.running,
                "waiting": sig.waiting,
                "hit": hit,
                "preempt": preemptions,
                "width": self.limiter.limit if self.limiter is not None else None,
                "live": live,
                "turns": self.turns,
                "out": self.out_tokens,
                # The TTFTs of the turns committed since the previous point (nearest rank); None without any.
                "ttft_p50": ttfts[(len(ttfts) - 1) // 2] if ttfts else None,
                "ttft_p95": ttfts[math.ceil(0.95 * len(ttfts)) - 1] if ttfts else None,
            }
        )
        if len(self.points) > MAX_POINTS:
            drop = len(self.points) - MAX_POINTS
            del self.points[:drop]
            self.dropped_points += drop
        self._bump()

    # -- compiling ------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the requests kept since they were sent: one not answered yet makes the phase ``prefilling``, its
        first token ``streaming``; the preview is the reply so far as a finished turn's shows it — its tool calls
        (the arguments grow as they stream), else its text's tail. A reply still thinking (reasoning only) streams
        with the preview it had. One that is over shows its reply and the phase until the next turn: ``tool`` (its
        calls run) or ``think``, and is no longer read."""
        over: list[str] = []
        for agent, watch in self._streams.items():
            view = watch.view
            card = watch.card
            record = view.record
            if record is not None:
                over.append(agent)
                card.phase = "tool" if record.tool_calls and record.ok else "think"
                if record.ttft is not None:
                    card.ttft = record.ttft
                card.reply = record
                self._bump(card, TURN)
                continue
            if view.t_first_token is None:
                if watch.seen < 0:
                    watch.seen = 0
                    card.phase = "prefilling"
                    self._bump(card, STREAM)
                continue
            calls = view.calls
            # How far the reply got: text pieces, or tool calls and their arguments' length (both only grow).
            size = len(view.content) + (len(calls) + sum(len(c["arguments"]) for c in calls.values()) if calls else 0)
            if size == watch.seen and card.phase == "streaming":
                continue  # nothing new since the last read (most streams between two flushes of a busy fleet)
            card.settle()  # the previous reply's preview, which a reply still thinking keeps showing
            preview = card.preview
            if size != watch.seen:
                watch.seen = size
                if calls:
                    preview = _calls_preview((c["name"], c["arguments"]) for c in calls.values())
                elif view.content:
                    preview = watch.text_tail()
            if preview == card.preview and card.phase == "streaming":
                continue  # nothing the page would show differently: not sent again
            card.preview = preview
            card.phase = "streaming"
            self._bump(card, STREAM)
        for agent in over:
            del self._streams[agent]

    def _summary(self) -> dict[str, Any]:
        counts = {s.value: n for s in AgentState if (n := self._counts.get(s.value))}
        lim = self.limiter_view() if self.limiter_view is not None else self.limiter
        wd = self.watchdog() if self.watchdog is not None else None
        return {
            "fleet": self.fleet,
            "run_id": self.run_id,
            "t": round(self.clock.now() - self.t0, 3),
            "counts": counts,
            "turns": self.turns,
            "limiter": None
            if lim is None
            else {
                "mode": lim.mode.value,
                "limit": lim.limit,
                "min": lim.min_limit,
                "max": lim.max_limit,
                "live": lim.live,
                "queued": lim.queued,
                "parked_total": lim.parked_total,
                "decisions": lim.decisions,
            },
            "watchdog": None if wd is None else {"granted": dict(wd.granted), "refused": dict(wd.refused)},
            "control": dict(self.control),
            "finished": self.finished,
            "bench": None if self.bench is None else {**self.bench.meta, "current": self.bench.current},
        }

    def snapshot(self) -> tuple[dict[str, Any], Cursor]:
        """Everything, and the cursor a stream goes on from."""
        self.refresh()
        body = {
            "summary": self._summary(),
            "agents": [c.public() for c in self.cards.values()],
            "decisions": list(self.decisions),
            "points": list(self.points),
        }
        levels = steps = 0
        if self.bench is not None:
            body["levels"], body["steps"] = list(self.bench.levels), list(self.bench.steps)
            levels, steps = len(self.bench.levels), len(self.bench.steps)
        return body, Cursor(self.version, self.dropped_points + len(self.points), len(self.decisions), levels, steps)

    def delta(self, cursor: Cursor, *, refresh: bool = True) -> dict[str, Any] | None:
        """What changed since ``cursor`` (which is moved on), or None when nothing did. ``refresh=False``: the
        caller has just refreshed (a second pass over the requests in flight would find nothing new)."""
        if refresh:
            self.refresh()
        if self.version == cursor.version:
            return None
        agents = []
        since = cursor.version
        versions, cards = self._log_v, self._log_c
        i = len(versions)
        while i and versions[i - 1] > since:  # the most recent change first, back to the cursor
            i -= 1
            card = cards[i]
            if card.v != versions[i]:
                continue  # changed again later: sent at that change
            # As much of the card as changed since the cursor: a busy fleet's cards change by their streams and
            # turns, whose tiers carry a third and two thirds of the whole card's bytes.
            if card.vf > since:
                agents.append(card.public())
            elif card.vt > since:
                agents.append(card.progress())
            else:
                agents.append(card.streaming())
        agents.reverse()  # in the order they last changed
        start = max(0, cursor.points - self.dropped_points)
        body = {
            "summary": self._summary(),
            "agents": agents,
            "decisions": self.decisions[cursor.decisions :],
            "points": self.points[start:],
        }
        if self.bench is not None:
            body["levels"] = self.bench.levels[cursor.levels :]
            body["steps"] = self.bench.steps[cursor.steps :]
            cursor.levels, cursor.steps = len(self.bench.levels), len(self.bench.steps)
        cursor.version = self.version
        cursor.points = self.dropped_points + len(self.points)
        cursor.decisions = len(self.decisions)
        return body


@dataclass
class Tee:
    """A ``FleetProgress`` that reports to the terminal's display (if any) and to the dashboard's state."""

    state: LiveState
    inner: FleetProgress | None = None  # the run's own display

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        if self.inner is not None:
            self.inner.agent(agent, state, rounds=rounds, detail=detail)
        self.state.agent(agent, state, rounds=rounds, detail=detail)

    def turn(self, agent: str, turn: TurnLog) -> None:
        if self.inner is not None:
            self.inner.turn(agent, turn)
        self.state.turn(agent, turn)

    def limiter(self, stats: LimiterStatistics) -> None:
        if self.inner is not None:
            self.inner.limiter(stats)
        self.state.limiter_changed(stats)
