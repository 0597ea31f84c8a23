"""Runs one load level: N agents of a workload against a target, sampled, recorded, then summarised.

A level is warm-up + measurement window, a profile over the one runner (``load.runner``). Agents start staggered
over the first second and run closed-loop. The window's edges are quiet (``endpoint.backend.QuiesceGate``): new requests
wait while the ones in flight finish, and the server's counters are sampled with nothing in flight, so the usage
side and the server side of every figure cover the same requests. The window lasts at least ``min_window_s`` and
until the level has measured enough completed turns (``required_turns``), at most ``window_s`` — a slow server gets
enough samples, a fast one is not kept longer than needed. Then the agents finish the turn in flight (within a
grace period, then are cancelled), and everything they did is in ``LevelData`` — records and server samples — for
``analysis.summarise``.

Nothing here is on a turn's path: the agents send through the connection's ``RecordingBackend`` (the level's
engine fields, the gate, the record log) and read the level's stop signal itself; the level's own code runs at its
edges, when a session ends (``session_done``) and when a turn asks for less than the workload drew
(``reply_clamped``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agentload.bench.analysis import LevelData
from agentload.bench.distributed import LevelSpec, RemoteLevel, run_remote
from agentload.bench.levelctx import LevelContext
from agentload.bench.sampler import MetricsSampler
from agentload.bench.target import Target
from agentload.clock import LoopClock
from agentload.endpoint.backend import QuiesceGate, RecordingBackend, RecordSink
from agentload.endpoint.connection import Connection, connect
from agentload.endpoint.output import EngineFields
from agentload.endpoint.signals import SignalPoller
from agentload.load.cluster import RayCluster
from agentload.load.runner import LoadHandle, run_load
from agentload.load.strategy import AllAtOnce
from agentload.workload.base import Workload
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing

# Called once a level's connection is open (the live dashboard subscribes to its monitor); returns the unsubscribe.
ConnectHook = Callable[[Connection], Callable[[], None]]

# Completed turns a level wants before its window may end (issue 9): per agent, and in all.
MIN_TURNS_PER_AGENT = 8
MIN_TURNS_TOTAL = 60
# How long an edge waits for the requests in flight to finish before sampling anyway (and saying so).
QUIESCE_TIMEOUT_S = 120.0
# Agents start staggered over this long, so they do not move in lockstep.
STAGGER_S = 1.0


def required_turns(agents: int, per_agent: int = MIN_TURNS_PER_AGENT, total: int = MIN_TURNS_TOTAL) -> int:
    return max(per_agent * agents, total)


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
    grace_s: float = 60.0,
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
    """
    clock = LoopClock()
    start = clock.now() - run_t0
    shortest = window_s if min_window_s is None else min(min_window_s, window_s)
    wanted = required_turns(agents) if min_turns is None else required_turns(agents, total=min_turns)
    data = LevelData(level, agents, context, workload.name, start, start + warmup_s, start + warmup_s + window_s,
                     t0=run_t0, min_turns=wanted, output_controlled=exact_output_engine is not None)  # fmt: skip
    # The watchdog tells a cold start or a long prefill from a dead server (it reads the server's own signals),
    # and the retrying backend resends a turn that hit a transient failure; every attempt is recorded.
    # One /metrics poller (the connection's monitor) feeds the watchdog, the liveness rule and the level's timeline.
    conn = await connect(target.base_url, target.transport, clock=clock)  # the target's transport stays open
    poller = conn.monitor
    remote: RemoteLevel | None = None
    gate: QuiesceGate | RemoteLevel
    if cluster is None:
        drivers = workload.agents(agents, context=context, seed=seed + 7919 * level)
        gate = QuiesceGate(clock)
        fields = EngineFields(exact_output_engine, pin_slots) if exact_output_engine or pin_slots else None
        backend = RecordingBackend(conn.backend, data.records, sink, gate=gate,
                                   fields=fields.add if fields is not None else None)  # fmt: skip
        ctx = LevelContext(backend, target.model, run_id, level, data, sizing, text_salt)
    else:
        # The agents run on the actors, each with its own connection; this one only watches the server.
        gate = remote = RemoteLevel(cluster, data, sink)
        spec = LevelSpec(target.model, target.engine, workload, agents, context, level, run_id,
                         seed + 7919 * level, sizing, exact_output_engine, pin_slots, grace_s, STAGGER_S,
                         text_salt)  # fmt: skip
    sampler = MetricsSampler(poller, t0=run_t0)
    sampler.start()
    unwatch = on_connect(conn) if on_connect is not None else None

    async def quiet_edge(edge: str) -> float:
        """Close the gate, let the requests in flight finish, sample the counters; the edge's run time."""
        gate.close()
        if not await gate.drained(QUIESCE_TIMEOUT_S):
            data.notes.append(
                f"the window's {edge} was sampled with {gate.in_flight} request(s) still in flight after "
                f"{QUIESCE_TIMEOUT_S:g} s: the usage and server figures may cover slightly different requests"
            )
        raw = await sampler.sample_once()
        # The sample's own time, so the window starts exactly at the counters it is measured from.
        return raw.sample.t if raw is not None else clock.now() - run_t0

    def measured() -> int:
        w0 = run_t0 + data.window_start
        return sum(1 for r in data.records if r.ok and r.t_sent >= w0)

    async def measure_level(load: LoadHandle | RemoteLevel) -> None:
        await asyncio.sleep(max(0.0, run_t0 + data.window_start - clock.now()))
        data.window_start = await quiet_edge("start")
        gate.open()
        cap = run_t0 + data.window_start + window_s
        await asyncio.sleep(max(0.0, run_t0 + data.window_start + shortest - clock.now()))
        # Polled once a second rather than woken per record: a count over the records is cheap at this rate.
        # Agents that are all done (a suite pass each) will not add turns: the window ends with them.
        while clock.now() < cap and measured() < wanted and not load.all_done():  # noqa: ASYNC110
            await asyncio.sleep(min(1.0, cap - clock.now()))
        load.stop()  # agents finish the turn they are in and start no other (the runner's grace period follows)
        data.end = await quiet_edge("end")
        gate.open()

    # On the one runner (``load.runner``): agents staggered over the first second so they do not move in
    # lockstep; the level's body decides the end; then ``grace_s`` for the turns in flight. The level races the
    # watchdog's dead-server rule (``endpoint.liveness``): a killed or frozen server stops it within ~25 s,
    # wherever it is — warm-up, a quiet edge waiting for requests that will never finish, the window. A driver
    # bug is a run-level failure, raised by the runner after its cleanup (per-request failures are data).
    try:
        if remote is None:
            outcome = await run_load(drivers, ctx, strategy=AllAtOnce(stagger_s=STAGGER_S, clock=clock),
                                     stop=ctx.stop, body=measure_level, liveness=conn.liveness, grace_s=grace_s,
                                     clock=clock)  # fmt: skip
        else:
            outcome = await run_remote(remote, spec, measure_level, conn.liveness)
        if outcome.lost is not None:
            data.lost = outcome.lost
            data.end = clock.now() - run_t0
            data.window_start = min(data.window_start, data.end)  # lost in the warm-up: an empty window, not < 0
            data.notes.append(f"stopped early: {data.lost}")
    finally:
        if unwatch is not None:
            unwatch()
        await sampler.stop()
        await conn.aclose()
    if data.lost is None and not any(r.ok for r in data.records) and _warming_seen(poller, run_t0 + data.start):
        data.notes.append(
            "the server said it was still warming up (/health not ready) during this level and no turn completed: "
            "its 0 tok/s measures the warm-up, not the load"
        )
    data.samples = sampler.samples
    return data


def _warming_seen(poller: SignalPoller, since: float) -> bool:
    return any(s.warming for s in poller.history if s.t >= since)
