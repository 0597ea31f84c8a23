"""Runs one load level: N agents of a workload against a target, sampled, recorded, then summarised.

A level is warm-up + measurement window, a profile over the one runner (``load.runner``). Agents start staggered
over the first second and run closed-loop. The window's edges are quiet (``endpoint.backend.QuiesceGate``): new requests
wait while the ones in flight finish, and the server's counters are sampled with nothing in flight, so the usage
side and the server side of every figure cover the same requests. The window lasts at least ``min_window_s`` and
until the level has measured enough completed turns (``required_turns``), at most ``window_s`` — a slow server gets
enough samples, a fast one is not kept longer than needed. Then the agents finish the turn in flight, and everything
they did is in ``LevelData`` — records and server samples — for ``analysis.summarise``.

**The window is a cap.** A stalled request, a stream of keep-alives or one that never ends must not stretch a level
past its plan, so every wait at the level's end is bounded by one grace, ``edge_grace_s(window_s)`` (a quarter of
the window, at least 10 s, at most ``QUIESCE_TIMEOUT_S``): each edge waits at most that long for the requests in
flight to finish (the end edge no later than the window's cap plus the grace), then cuts them — each ends with a
record of outcome ``cancelled``, error ``cut`` (``endpoint.client.CutScope``) — and samples. After the end edge the
turns held at the closed edge go out and get the same grace before they are cut. The level's window is what it
really was (``window_start`` to ``end``), and its notes say how many requests were cut where.

Nothing here is on a turn's path: the agents send through the connection's ``RecordingBackend`` (the level's
engine fields, the gate, the record log) and read the level's stop signal itself; the level's own code runs at its
edges, when a session ends (``session_done``) and when a turn asks for less than the workload drew
(``reply_clamped``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agentload.bench.analysis import LevelData
from agentload.bench.distributed import LevelSpec, RemoteLevel, run_remote
from agentload.bench.levelctx import LevelContext
from agentload.bench.sampler import MetricsSampler
from agentload.bench.target import Target
from agentload.clock import LoopClock
from agentload.endpoint.backend import QuiesceGate, RecordingBackend, RecordSink
from agentload.endpoint.client import CutScope, cut_scope
from agentload.endpoint.connection import Connection, connect
from agentload.endpoint.output import EngineFields
from agentload.endpoint.signals import SignalPoller
from agentload.load.cluster import RayCluster
from agentload.load.runner import LoadHandle, LoadOutcome, run_load
from agentload.load.strategy import AllAtOnce
from agentload.workload.base import ReplayCeiling, ReplayPace, ReplaySessions, Workload
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing

# Called once a level's connection is open (the live dashboard subscribes to its monitor); returns the unsubscribe.
ConnectHook = Callable[[Connection], Callable[[], None]]

# Completed turns a level wants before its window may end (a level judged on a handful of turns is noise): per
# agent, and in all.
MIN_TURNS_PER_AGENT = 8
MIN_TURNS_TOTAL = 60
# The longest an edge waits for the requests in flight to finish before cutting them (and saying so).
QUIESCE_TIMEOUT_S = 120.0
# The shortest grace an edge gives (a short window's requests still get time for one real prefill).
MIN_EDGE_GRACE_S = 10.0


def edge_grace_s(window_s: float) -> float:
    """How long a level's edge waits for requests in flight before cutting them; see the module docstring."""
    return min(QUIESCE_TIMEOUT_S, max(MIN_EDGE_GRACE_S, window_s / 4))


# How long an edge waits for cut requests to come back with their records (they return at once; a bound all the same).
CUT_SETTLE_S = 5.0
# Agents start staggered over this long, so they do not move in lockstep.
STAGGER_S = 1.0


def required_turns(agents: int, per_agent: int = MIN_TURNS_PER_AGENT, total: int = MIN_TURNS_TOTAL) -> int:
    return max(per_agent * agents, total)


class _LevelWindow:
    """The level's body on the runner: the warm-up, the quiet start edge, the window, the quiet end edge.

    It polls the records once a second and waits at the edges; nothing of it is on a turn's path.
    """

    def __init__(
        self,
        data: LevelData,
        gate: QuiesceGate | RemoteLevel,
        sampler: MetricsSampler,
        scope: CutScope | None,  # None: the agents run on Ray actors, whose requests the edges cannot cut
        clock: LoopClock,
        run_t0: float,
        *,
        grace: float,
        window_s: float,
        shortest: float,
        wanted: int,
    ) -> None:
        self.data, self.gate, self.sampler, self.scope = data, gate, sampler, scope
        self.clock, self.run_t0 = clock, run_t0
        self.grace, self.window_s, self.shortest, self.wanted = grace, window_s, shortest, wanted

    async def settle(self, wait_s: float, edge: str) -> None:
        """Wait up to ``wait_s`` for the requests in flight to finish; cut the rest (and say so)."""
        gate, data = self.gate, self.data
        if await gate.drained(max(0.0, wait_s)):
            return
        stuck = gate.in_flight
        if self.scope is None:
            data.notes.append(f"{edge} was sampled with {stuck} request(s) still in flight after {wait_s:.0f} s: "
                              "the usage and server figures may cover slightly different requests")  # fmt: skip
            return
        cut = self.scope.cut(f"still in flight {wait_s:.0f} s after {edge} (the level's grace)")
        await gate.drained(CUT_SETTLE_S)  # a cut request returns at once, with its record
        data.cut_requests += cut
        data.notes.append(f"{edge}: {cut} request(s) still in flight after {wait_s:.0f} s (the level's grace) were "
                          "cut; the usage and server figures may cover slightly different requests")  # fmt: skip

    async def quiet_edge(self, edge: str, wait_s: float) -> float:
        """Close the gate, let the requests in flight finish (cut after ``wait_s``), sample; the edge's run time."""
        self.gate.close()
        await self.settle(wait_s, f"the window's {edge}")
        raw = await self.sampler.sample_once()
        # The sample's own time, so the window starts exactly at the counters it is measured from.
        return raw.sample.t if raw is not None else self.clock.now() - self.run_t0

    def measured(self) -> int:
        w0 = self.run_t0 + self.data.window_start
        return sum(1 for r in self.data.records if r.ok and r.t_sent >= w0)

    async def measure(self, load: LoadHandle | RemoteLevel) -> None:
        data, clock, run_t0, grace = self.data, self.clock, self.run_t0, self.grace
        await asyncio.sleep(max(0.0, run_t0 + data.window_start - clock.now()))
        data.window_start = await self.quiet_edge("start", grace)
        self.gate.open()
        cap = run_t0 + data.window_start + self.window_s
        await asyncio.sleep(max(0.0, run_t0 + data.window_start + self.shortest - clock.now()))
        # Polled once a second rather than woken per record: a count over the records is cheap at this rate.
        # Agents that are all done (a suite pass each) will not add turns: the window ends with them.
        while clock.now() < cap and self.measured() < self.wanted and not load.all_done():  # noqa: ASYNC110
            await asyncio.sleep(min(1.0, cap - clock.now()))
        load.stop()  # agents finish the turn they are in and start no other
        # A level that ended early on its turn count may wait longer for its last requests, never past the cap's grace.
        data.end = await self.quiet_edge("end", min(QUIESCE_TIMEOUT_S, cap + grace - clock.now()))
        self.gate.open()
        # The turns held at the closed edge go out now (the agents stop after them): the same grace, then cut.
        if isinstance(load, LoadHandle) and not await load.wait_done(grace):
            await self.settle(0.0, "the turns sent after the window")


async def run_level(
    target: Target,
    workload: Workload,
    *,
    agents: int,
    context: int,
    level: int,
    run_id: str,
    run_t0: float,
    text_salt: str | None = None,
    warmup_s: float,
    window_s: float,
    min_window_s: float | None = None,
    min_turns: int | None = None,  # the floor "in all" (default MIN_TURNS_TOTAL); 8 per agent still apply
    grace_s: float | None = None,
    seed: int = 0,
    sink: RecordSink | None = None,
    sizing: TokenSizing = SIMULATOR_SIZING,
    exact_output_engine: str | None = None,
    pin_slots: int | None = None,
    on_connect: ConnectHook | None = None,
    cluster: RayCluster | None = None,
) -> LevelData:
    """Run ``agents`` agents for a warm-up and a work-sized window on the target's clock; return what they did.

    ``exact_output_engine``: ask that engine for exactly each request's ``max_tokens`` (None: the model decides).
    ``pin_slots``: a slot server's slot count; each agent's turns go to its own slot (None: the server chooses).
    ``text_salt``: what the workload's text is salted with beside the seed (default: the run id).
    ``cluster``: run the agents on its Ray actors (``bench.distributed``); the window, edges and samples stay here.
    ``grace_s``: the edges' grace (default ``edge_grace_s(window_s)``).
    """
    clock = LoopClock()
    grace = edge_grace_s(window_s) if grace_s is None else grace_s
    start = clock.now() - run_t0
    wanted = required_turns(agents) if min_turns is None else required_turns(agents, total=min_turns)
    data = LevelData(level, agents, context, workload.name, start, start + warmup_s, start + warmup_s + window_s,
                     t0=run_t0, min_turns=wanted, output_controlled=exact_output_engine is not None)  # fmt: skip
    if isinstance(workload, ReplayCeiling):
        data.ceiling = workload.ceiling
    if isinstance(workload, ReplayPace):
        data.pace = workload.turn_pace
    if isinstance(workload, ReplaySessions):
        data.sessions = workload.session_walls
    # The watchdog tells a cold start or a long prefill from a dead server (it reads the server's own signals),
    # and the retrying backend resends a turn that hit a transient failure; every attempt is recorded.
    # One /metrics poller (the connection's monitor) feeds the watchdog, the liveness rule and the level's timeline.
    conn = await connect(target.base_url, target.transport, clock=clock)  # the target's transport stays open
    level_spec = LevelSpec(target.model, target.engine, workload, agents, context, level, run_id, seed + 7919 * level,
                           sizing, exact_output_engine, pin_slots, grace, STAGGER_S, text_salt)  # fmt: skip
    placed = _place_agents(level_spec, conn, data, sink, clock, cluster)
    sampler = MetricsSampler(conn.monitor, t0=run_t0)
    sampler.start()
    unwatch = on_connect(conn) if on_connect is not None else None
    # The requests this level sends (its drivers' tasks inherit the scope), so an edge can cut them.
    scope_token = cut_scope.set(placed.scope) if placed.scope is not None else None
    shortest = window_s if min_window_s is None else min(min_window_s, window_s)
    window = _LevelWindow(data, placed.gate, sampler, placed.scope, clock, run_t0, grace=grace, window_s=window_s,
                          shortest=shortest, wanted=wanted)  # fmt: skip
    try:
        outcome = await placed.run(window.measure, conn, clock)
        if outcome.lost is not None:
            _note_lost(data, outcome.lost, clock.now() - run_t0)
    finally:
        if scope_token is not None:
            cut_scope.reset(scope_token)
        if unwatch is not None:
            unwatch()
        await sampler.stop()
        await conn.aclose()
    if data.lost is None and not any(r.ok for r in data.records) and _warming_seen(conn.monitor, run_t0 + data.start):
        data.notes.append(
            "the server said it was still warming up (/health not ready) during this level and no turn completed: "
            "its 0 tok/s measures the warm-up, not the load"
        )
    data.samples = sampler.samples
    return data


class _HereAgents:
    """The level's agents in this process, on the one runner (``load.runner``), sending through one connection."""

    def __init__(self, spec: LevelSpec, conn: Connection, data: LevelData, sink: RecordSink | None, clock: LoopClock):
        self.drivers = spec.workload.agents(spec.agents, context=spec.context, seed=spec.seed)
        self.gate = QuiesceGate(clock)
        exact, pins = spec.exact_output_engine, spec.pin_slots
        fields = EngineFields(exact, pins) if exact or pins else None
        backend = RecordingBackend(conn.backend, data.records, sink, gate=self.gate,
                                   fields=fields.add if fields is not None else None)  # fmt: skip
        self.ctx = LevelContext(backend, spec.model, spec.run_id, spec.level, data, spec.sizing, spec.text_salt)
        self.scope: CutScope | None = CutScope()

    async def run(
        self, body: Callable[[LoadHandle], Awaitable[None]], conn: Connection, clock: LoopClock
    ) -> LoadOutcome:
        # Agents staggered over the first second so they do not move in lockstep; the level's body decides the end
        # (its edges cut what outlives their grace, so only drivers between turns are left, given ``CUT_SETTLE_S``).
        # The level races the watchdog's dead-server rule (``endpoint.liveness``): a killed or frozen server stops
        # it within ~25 s, wherever it is — warm-up, a quiet edge waiting for requests that will never finish, the
        # window. A driver bug is a run-level failure, raised by the runner after its cleanup (per-request failures
        # are data).
        return await run_load(self.drivers, self.ctx, strategy=AllAtOnce(stagger_s=STAGGER_S, clock=clock),
                              stop=self.ctx.stop, body=body, liveness=conn.liveness, grace_s=CUT_SETTLE_S,
                              clock=clock)  # fmt: skip


class _RayAgents:
    """The level's agents on Ray actors, each with its own connection; this process's only watches the server.

    Their requests run elsewhere, so the edges cannot cut them: they wait out the grace and say so.
    """

    def __init__(self, spec: LevelSpec, cluster: RayCluster, data: LevelData, sink: RecordSink | None):
        self.spec = spec
        self.gate = self.remote = RemoteLevel(cluster, data, sink)
        self.scope: CutScope | None = None

    async def run(
        self, body: Callable[[RemoteLevel], Awaitable[None]], conn: Connection, clock: LoopClock
    ) -> LoadOutcome:
        return await run_remote(self.remote, self.spec, body, conn.liveness)


def _place_agents(
    spec: LevelSpec, conn: Connection, data: LevelData, sink: RecordSink | None, clock: LoopClock,
    cluster: RayCluster | None,
) -> _HereAgents | _RayAgents:  # fmt: skip
    return _HereAgents(spec, conn, data, sink, clock) if cluster is None else _RayAgents(spec, cluster, data, sink)


def _note_lost(data: LevelData, lost: str, now: float) -> None:
    """The server was lost at ``now`` (run time): the level ends there, and says why."""
    data.lost = lost
    data.end = now
    data.window_start = min(data.window_start, data.end)  # lost in the warm-up: an empty window, not < 0
    data.notes.append(f"stopped early: {data.lost}")


def _warming_seen(poller: SignalPoller, since: float) -> bool:
    return any(s.warming for s in poller.history if s.t >= since)
