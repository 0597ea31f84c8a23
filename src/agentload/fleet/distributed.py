"""``agentload run --executor ray``: a fleet's agents stay in this process; their requests are streamed
by Ray actors.

Why not the agents themselves on the actors, as ``bench.distributed`` puts a level's and ``suite.distributed`` a
level's sessions: a fleet's agents touch the run's global state at every turn. The limiter's one gate parks them
at turn boundaries; every finished turn feeds the width controller and is committed to the one checkpoint log
before the agent goes on; the dashboard pauses the fleet or stops and restarts one agent at any moment; a task's
agents start once another task's are done. On actors, each of those would be a round trip to this process
anyway, and "one gate, one log, nothing lost or repeated" would have to be rebuilt across processes. What costs a
client its CPU is the stream — the request's encoding, the SSE parsing, the per-chunk stamps, the stall watchdog,
the retries — and that is what moves: the driver (this process) keeps the agents, their conversations, tools and
workspaces, the gate, the limiter, the log, the progress and the dashboard, and each turn's request is sent by an
actor, with that actor's own connection (client, watchdog, retries, monitor), and comes back as its records.

* **Placement.** An agent's first request goes to the live actor that serves the fewest agents; every later one to
  the same actor (a session stays on one actor, its connection and its watchdog's history with it).
* **Clocks.** Records come back on the actor's clock and are moved onto the driver's (no change on its machine,
  where ``CLOCK_MONOTONIC`` is one clock); TTFT and ITL are durations taken inside the actor.
* **A dead actor.** What it had in flight was not committed (a turn is committed only once its records are back
  here), so each of those turns is sent again by a live actor, which serves the agent from then on: no committed
  turn is lost or sent twice; the run's warnings say how many agents moved. With no live actor left the run stops
  with ``ExecutorError`` — everything committed is kept and ``--resume`` continues it.
* **A cancel** (a restart from the dashboard, ``--stop-after``, the run's end) is passed on to the actor, which
  drops the request (its stream closed, so the server aborts it), as in one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentload.clock import LoopClock
from agentload.endpoint.connection import Connection, ConnectionOptions, connect_endpoint
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.endpoint.transport import Endpoint
from agentload.errors import ExecutorError
from agentload.load.cluster import ClockedActor, ClockOffset, dead_actor_errors


class FleetWorker(ClockedActor):
    """A Ray async actor: sends the turns it is given over its own connection to the server (see the module)."""

    def __init__(self, index: int, count: int, endpoint: Endpoint, engine: str | None = None) -> None:
        self.index = index
        self.count = count
        self.endpoint = endpoint
        self.engine = engine
        self._conn: Connection | None = None
        self._opening = asyncio.Lock()
        self._loads: set[asyncio.Task[list[RequestRecord]]] = set()  # turns in flight (a killed fake ends them)

    async def _connection(self) -> Connection:
        async with self._opening:  # the first turns arrive together: one connection, not one each
            if self._conn is None:
                self._conn = await connect_endpoint(self.endpoint, options=ConnectionOptions(engine=self.engine),
                                                    clock=LoopClock())  # fmt: skip
            return self._conn

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        """One turn, with its retries: every attempt's record, as ``RetryingBackend.complete`` returns them."""
        conn = await self._connection()
        task = asyncio.ensure_future(conn.backend.complete(body, ids))
        self._loads.add(task)
        try:
            return await task  # a cancel of this call (``ray.cancel``) cancels the turn with it
        finally:
            self._loads.discard(task)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.aclose()
            self._conn = None


class RayTurns:
    """The fleet's ``ChatBackend`` over actors: each turn sent by the agent's actor, records back on this clock.

    ``cluster``: a started ``load.cluster.RayCluster`` of ``FleetWorker`` actors (or a test's stand-in with the same
    ``actors``, ``offsets``, ``ray`` and ``cancel``). ``warn`` is told, once per dead actor, what happened.
    """

    def __init__(self, cluster: Any, *, warn: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.warn = warn or (lambda _: None)
        self.actors: Sequence[Any] = list(cluster.actors)
        offsets: Sequence[ClockOffset] = cluster.offsets or [ClockOffset(0.0, 0.0, same_node=True)] * len(self.actors)
        self.offsets = list(offsets)
        self.alive = list(range(len(self.actors)))
        self.placed: dict[str, int] = {}  # agent → actor
        self.served = [0] * len(self.actors)  # agents placed on each actor (kept as they are placed)
        self.warnings: list[str] = []
        self._dead = dead_actor_errors(cluster.ray)

    def _actor_for(self, agent: str) -> int:
        k = self.placed.get(agent)
        if k is None or k not in self.alive:
            if not self.alive:
                raise ExecutorError("every Ray actor died; the turns committed so far are kept")
            served = self.served
            k = min(self.alive, key=lambda a: (served[a], a))
            self.placed[agent] = k
            served[k] += 1
        return k

    def _lose(self, k: int, exc: BaseException) -> None:
        if k not in self.alive:
            return
        self.alive.remove(k)
        agents = self.served[k]
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = (f"actor {k} of {len(self.actors)} died ({first}): its turns in flight were not committed and "
                   f"are sent again by the live actors, which serve the {agents} agents it had served from now "
                   "on")  # fmt: skip
        self.warnings.append(message)
        self.warn(message)

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        while True:
            k = self._actor_for(ids.agent)
            # A plain dict: Ray pickles the body, and a read-only mapping view would not pickle.
            call = self.actors[k].complete.remote(dict(body), ids)
            try:
                records: list[RequestRecord] = await call
            except asyncio.CancelledError:
                self.cluster.cancel(call)  # the actor drops the request too
                raise
            except self._dead as exc:
                self._lose(k, exc)
                continue  # nothing of this turn was committed: it is sent again, by a live actor
            by = -self.offsets[k].offset_s
            return [r.moved(by) for r in records]

    async def close(self) -> None:
        """Close every live actor's connection (its monitor and transport) before the actors are ended."""
        calls = [self.actors[k].close.remote() for k in self.alive]
        await asyncio.gather(*calls, return_exceptions=True)
