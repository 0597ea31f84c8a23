"""A bench level on Ray: its agents spread over async actors, its window kept by the driver.

The driver (``bench.runner.run_level``) keeps everything a level decides globally — the warm-up and the window, the
quiet edges, the server's samples, the end — and the actors (``LevelWorker``, one per core, started by
``load.cluster``) run the agents. Actor k of n runs agents k, k + n, k + 2n … of the level's seeded workload: the
workload builds all of a level's drivers from the seed on every actor and each keeps its share, so agent i's
conversation is the one it has in a single-process run, and it starts when it would there (the stagger by its
place in the whole level). Each actor has its own connection (client, watchdog, retries, monitor) and its own
``RecordingBackend`` and ``QuiesceGate``; the agents' turns never leave the actor.

The driver pulls each actor's new records every ``PULL_INTERVAL_S`` (a batch per actor: one Ray call, whatever
the number of records), puts them on its clock (``load.cluster``: no change on one machine), hands them to the
run's sink and counts them for the window's end. A quiet edge closes every actor's gate and waits until all are
drained before the server is sampled, so both sides of every figure cover the same requests, as in one process.

An actor that dies (its process killed, its node lost) loses only what it had not yet handed over — its records
since the last pull and its turns in flight; the level goes on with the others and says what was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentload.bench.analysis import LevelData
from agentload.bench.levelctx import LevelContext
from agentload.clock import LoopClock
from agentload.endpoint.backend import QuiesceGate, RecordingBackend, RecordSink
from agentload.endpoint.connection import Connection, connect_endpoint
from agentload.endpoint.output import EngineFields
from agentload.endpoint.records import RequestRecord
from agentload.endpoint.transport import Endpoint
from agentload.errors import ExecutorError
from agentload.load.cluster import (
    PULL_INTERVAL_S,
    ClockedActor,
    ClockOffset,
    RayCluster,
    dead_actor_errors,
    now,
)
from agentload.load.runner import End, Liveness, LoadHandle, LoadOutcome, run_load
from agentload.load.strategy import AllAtOnce
from agentload.workload.base import Workload
from agentload.workload.sizing import TokenSizing


@dataclass(frozen=True)
class LevelSpec:
    """What an actor needs to run its share of a level (pickled by Ray)."""

    model: str
    engine: str | None
    workload: Workload
    agents: int
    context: int
    level: int
    run_id: str
    seed: int  # the level's own (the run's seed + 7919 × level, as in one process)
    sizing: TokenSizing
    exact_output_engine: str | None
    pin_slots: int | None
    grace_s: float
    stagger_s: float
    text_salt: str | None = None  # the text's salt beside the seed (None: the run id)


@dataclass
class Batch:
    """An actor's records since the last pull, and where its agents are."""

    records: list[RequestRecord]
    in_flight: int
    done: bool  # every agent of the share has returned


@dataclass
class Share:
    """What an actor's share of the level came to, once it ended."""

    records: list[RequestRecord]
    agents: int
    sessions_ok: int
    sessions_failed: int
    passed: int
    scored: int
    drawn: dict[tuple[str, int], int]
    lost: str | None
    cancelled: int


class LevelWorker(ClockedActor):
    """A Ray async actor: runs its share of each level it is given, on its own loop (see the module)."""

    def __init__(self, index: int, count: int, endpoint: Endpoint) -> None:
        self.index = index
        self.count = count
        self.endpoint = endpoint
        self._loads: list[asyncio.Task[LoadOutcome]] = []
        self._handles: list[LoadHandle] = []
        self._stop = asyncio.Event()
        self._records: list[RequestRecord] = []
        self._gate: QuiesceGate | None = None
        self._conn: Connection | None = None
        self._data: LevelData | None = None
        self._spec: LevelSpec | None = None
        self._ctx: LevelContext | None = None
        self._agents = 0

    async def start(self, spec: LevelSpec) -> int:
        """Start this actor's share of the level; returns how many agents it runs."""
        if any(not t.done() for t in self._loads):
            raise RuntimeError("a level is already running on this actor")
        clock = LoopClock()
        self._conn = await connect_endpoint(self.endpoint, clock=clock)
        self._spec = spec
        self._loads, self._handles, self._agents = [], [], 0
        self._records = []
        self._gate = gate = QuiesceGate(clock)
        self._data = data = LevelData(spec.level, spec.agents, spec.context, spec.workload.name, 0.0, 0.0, 0.0)
        fields = EngineFields(spec.exact_output_engine, spec.pin_slots) if spec.exact_output_engine or spec.pin_slots \
            else None  # fmt: skip
        backend = RecordingBackend(self._conn.backend, self._records, None, gate=gate,
                                   fields=fields.add if fields is not None else None)  # fmt: skip
        self._ctx = LevelContext(backend, spec.model, spec.run_id, spec.level, data, spec.sizing, spec.text_salt)
        self._stop = asyncio.Event()
        self._launch(list(range(self.index, spec.agents, self.count)), {}, spec.stagger_s, adopted=False)
        return self._agents

    async def adopt(self, positions: list[int], sessions: dict[str, int]) -> int:
        """Run agents of a dead actor's share from now on, each from its next session (``sessions``: the last one
        the driver saved a turn of, by agent): no turn the level saved is run again. Returns how many restarted."""
        return self._launch(positions, sessions, 0.0, adopted=True)

    def _launch(self, positions: list[int], sessions: dict[str, int], stagger_s: float, adopted: bool) -> int:
        spec, ctx, conn = self._spec, self._ctx, self._conn
        if spec is None or ctx is None or conn is None:
            raise RuntimeError("no level started on this actor")
        drivers = spec.workload.agents(spec.agents, context=spec.context, seed=spec.seed)
        if adopted:
            # Only agents that can start at a later session: any other would run its saved turns again.
            kept = [(i, d) for i in positions if resume_after(d := drivers[i], sessions.get(d.agent_id, -1))]
            positions = [i for i, _ in kept]
            mine = [d for _, d in kept]
        else:
            mine = [drivers[i] for i in positions]
        self._agents += len(mine)

        async def until_told(handle: LoadHandle) -> None:
            self._handles.append(handle)
            await self._stop.wait()
            handle.stop()

        if not mine:
            return 0
        strategy = AllAtOnce(stagger_s=stagger_s, clock=ctx.clock, positions=positions, of=spec.agents)
        load = run_load(mine, ctx, strategy=strategy, stop=ctx.stop, body=until_told, liveness=conn.liveness,
                        grace_s=spec.grace_s, clock=LoopClock())  # fmt: skip
        self._loads.append(asyncio.ensure_future(load))
        return len(mine)

    async def take(self) -> Batch:
        out = self._records[:]
        self._records.clear()
        done = all(t.done() for t in self._loads) or (
            len(self._handles) == len(self._loads) and all(h.all_done() for h in self._handles)
        )
        return Batch(out, self._gate.in_flight if self._gate is not None else 0, done)

    async def quiet(self, timeout_s: float) -> int:
        """Close the gate and wait for the requests in flight to finish; the number still in flight (0: quiet)."""
        if self._gate is None:
            return 0
        self._gate.close()
        await self._gate.drained(timeout_s)
        return self._gate.in_flight

    async def open(self) -> None:
        if self._gate is not None:
            self._gate.open()

    async def stop(self) -> None:
        self._stop.set()

    async def finish(self) -> Share:
        """Wait for the share to end (after ``stop``, its grace) and hand over the rest."""
        if self._data is None or self._conn is None:
            raise RuntimeError("finish() before start()")
        try:
            outcomes = await asyncio.gather(*self._loads)
        finally:
            await self._conn.aclose()
        data = self._data
        rest = self._records[:]
        self._records.clear()
        lost = next((o.lost for o in outcomes if o.lost is not None), None)
        return Share(rest, self._agents, data.sessions_ok, data.sessions_failed, data.passed, data.scored,
                     dict(data.drawn), lost, sum(o.cancelled for o in outcomes))  # fmt: skip


def resume_after(driver: Any, session: int) -> bool:
    """Have a rebuilt driver start at the session after ``session`` (an agentic agent: ``sessions_started``)."""
    agent = getattr(driver, "agent", driver)
    if not isinstance(getattr(agent, "sessions_started", None), int):
        return False
    agent.sessions_started = session + 1
    return True


def last_sessions(records: Sequence[RequestRecord]) -> dict[str, int]:
    """The last session each agent saved a turn of, from record ids ``AGENT/sN`` (agentic sessions)."""
    out: dict[str, int] = {}
    for r in records:
        agent, sep, n = r.ids.agent.rpartition("/s")
        if sep and n.isdigit():
            out[agent] = max(out.get(agent, -1), int(n))
    return out


def on_driver_clock(record: RequestRecord, offset: ClockOffset) -> RequestRecord:
    """``record`` with its times moved from an actor's clock to the driver's (no change on the driver's node)."""
    return record.moved(-offset.offset_s)


@dataclass
class RemoteLevel:
    """The driver's side of a level on actors: a gate for the quiet edges and a handle for the window's body."""

    cluster: RayCluster
    data: LevelData
    sink: RecordSink | None
    in_flight: int = 0
    _alive: list[int] = field(default_factory=list)
    _done: dict[int, bool] = field(default_factory=dict)
    _pending: list[Awaitable[Any]] = field(default_factory=list)
    _agents: dict[int, int] = field(default_factory=dict)
    _spec: LevelSpec | None = None
    _finishing: bool = False
    pulled: int = 0  # records taken from the actors so far

    async def start(self, spec: LevelSpec) -> None:
        self._spec = spec
        self._alive = list(range(len(self.cluster.actors)))
        self._done = dict.fromkeys(self._alive, False)
        counts = await self._each(lambda _, a: a.start.remote(spec))  # one found dead here: its agents go elsewhere
        self._agents = {i: n for i, n in counts.items() if n is not None}

    # -- the gate, as the level's quiet edges use it --------------------------------------------------------------
    def close(self) -> None:
        """Nothing here: ``drained`` closes every actor's gate and waits in one call each."""

    async def drained(self, timeout_s: float) -> bool:
        left = await self._each(lambda _, a: a.quiet.remote(timeout_s))
        self.in_flight = sum(n for n in left.values() if n is not None)
        return self.in_flight == 0

    def open(self) -> None:
        self._pending.append(asyncio.ensure_future(self._each(lambda _, a: a.open.remote())))

    # -- the handle, as the window's body uses it --------------------------------------------------------------
    def stop(self) -> None:
        self._pending.append(asyncio.ensure_future(self._each(lambda _, a: a.stop.remote())))

    def all_done(self) -> bool:
        return all(self._done.get(i, True) for i in self._alive)

    # -------------------------------------------------------------------------------------------------------------
    async def _each(self, call: Callable[[int, Any], Awaitable[Any]]) -> dict[int, Any]:
        """``call`` (index, actor) on every live actor at once; one found dead is dropped, its agents restarted."""
        alive = list(self._alive)
        results = await asyncio.gather(*(call(i, self.cluster.actors[i]) for i in alive), return_exceptions=True)
        out: dict[int, Any] = {}
        dead = dead_actor_errors(self.cluster.ray)
        for i, r in zip(alive, results, strict=True):
            if isinstance(r, dead):
                self._lose(i, r)
                out[i] = None
            elif isinstance(r, BaseException):
                raise r
            else:
                out[i] = r
        return out

    def _lose(self, i: int, exc: BaseException) -> None:
        if i not in self._alive:
            return
        self._alive.remove(i)
        self._done.pop(i, None)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if self._finishing:  # the level is over: nothing to restart, only what was lost to say
            self.data.notes.append(f"actor {i} died as the level ended ({first}): its records since the last pull "
                                   "are lost")  # fmt: skip
            return
        self._pending.append(asyncio.ensure_future(self._adopt(i, first)))

    async def _adopt(self, dead: int, why: str) -> None:
        """Restart a dead actor's agents on the live ones, each from its next session; note what happened."""
        n = len(self.cluster.actors)
        if not self._alive:
            raise ExecutorError(f"every Ray actor died (the last: actor {dead}, {why}); the records saved so far "
                                "are kept")  # fmt: skip
        assert self._spec is not None
        positions = list(range(dead, self._spec.agents, n))
        sessions = last_sessions(self.data.records)
        shares = {a: positions[k :: len(self._alive)] for k, a in enumerate(self._alive)}
        started = await self._each(lambda i, a: a.adopt.remote(shares[i], sessions))
        restarted = sum(v for v in started.values() if v)
        where = ", ".join(str(a) for a in started)
        self.data.notes.append(
            f"actor {dead} of {n} died during this level ({why}): the records it had handed over are kept, its "
            f"turns in flight and its records since the last pull are lost; {restarted} of its {len(positions)} "
            f"agents went on on actor(s) {where}, each from its next session (no saved turn run again)"
            + ("" if restarted == len(positions) else "; the others' workload cannot start an agent mid-way")
        )
        for a in started:
            self._done[a] = False

    def _keep(self, i: int, records: Sequence[RequestRecord]) -> None:
        offset = self.cluster.offsets[i] if i < len(self.cluster.offsets) else ClockOffset(0.0, 0.0, True)
        for r in records:
            r = on_driver_clock(r, offset)
            self.data.records.append(r)
            if self.sink is not None:
                self.sink(r)
        self.pulled += len(records)

    async def pull(self) -> None:
        batches = await self._each(lambda _, a: a.take.remote())
        for i, b in batches.items():
            if b is not None:
                self._keep(i, b.records)
                self._done[i] = b.done

    async def pull_loop(self) -> None:
        while True:
            await asyncio.sleep(PULL_INTERVAL_S)
            await self.pull()

    async def finish(self) -> LoadOutcome:
        """Stop what is left, wait for every live actor's share, merge; an outcome as one process would give."""
        failed = [r for r in await asyncio.gather(*self._pending, return_exceptions=True)
                  if isinstance(r, BaseException)]  # fmt: skip
        self._pending.clear()
        if failed:
            raise failed[0]
        self._finishing = True
        await self._each(lambda _, a: a.stop.remote())
        shares = await self._each(lambda _, a: a.finish.remote())
        lost: str | None = None
        cancelled = 0
        for i, s in shares.items():
            if s is None:
                continue
            self._keep(i, s.records)
            d = self.data
            d.sessions_ok += s.sessions_ok
            d.sessions_failed += s.sessions_failed
            d.passed += s.passed
            d.scored += s.scored
            d.drawn.update(s.drawn)
            lost = lost or s.lost
            cancelled += s.cancelled
        return LoadOutcome(ended=End.LOST if lost else End.BODY, lost=lost, cancelled=cancelled, wall_s=0.0)


async def run_remote(
    level: RemoteLevel, spec: LevelSpec, body: Callable[[Any], Awaitable[None]], liveness: Liveness
) -> LoadOutcome:
    """Run ``body`` (the window) over the actors' share of the level until it returns or the server is lost."""
    t0 = now()
    await level.start(spec)
    puller = asyncio.ensure_future(level.pull_loop())
    body_task = asyncio.ensure_future(body(level))
    watch = asyncio.ensure_future(liveness.wait_lost())
    lost: str | None = None
    try:
        done, _ = await asyncio.wait({body_task, watch, puller}, return_when=asyncio.FIRST_COMPLETED)
        if watch in done:
            lost = watch.result()
        if puller in done:
            puller.result()  # a bug: raised after the cleanup below
        if body_task in done:
            body_task.result()
    finally:
        for t in (puller, body_task, watch):
            t.cancel()
        await asyncio.gather(puller, body_task, watch, return_exceptions=True)
        outcome = await level.finish()
    lost = lost or outcome.lost
    return LoadOutcome(End.LOST if lost else End.BODY, lost, outcome.cancelled, now() - t0)
