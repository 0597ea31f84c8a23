"""A suite level on Ray: its sessions spread over async actors, its results merged by the driver.

Actor k of n runs sessions k, k + n, k + 2n … of the level (``agent-i`` runs every selected test in order, as in
one process), each actor with its own connection, watchdog and liveness rule. The driver takes each actor's
finished tests every ``PULL_INTERVAL_S`` (for the progress bar) and, when the level ends, its finished sessions.

An actor that dies loses nothing already handed over. Its sessions are not run again (a session's tests are one
agent's run in order; starting it over would repeat them): each ends as a failed session that keeps the tests the
driver had received from it, with the error saying its actor died. Every actor dead is an ``ExecutorError``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentload.agent.loop import ConversationDriver
from agentload.clock import LoopClock
from agentload.endpoint.connection import Connection, connect_endpoint
from agentload.endpoint.transport import Endpoint
from agentload.errors import ExecutorError
from agentload.load.cluster import PULL_INTERVAL_S, ClockedActor, RayCluster, dead_actor_errors
from agentload.load.runner import LoadOutcome, run_load
from agentload.suite.cases import select
from agentload.suite.model import SuiteTest
from agentload.suite.results import AgentResult, AgentStatus, TestResult
from agentload.suite.runner import LevelAccumulator, LevelContext, SuiteConfig, SuiteSession, TestDone


@dataclass(frozen=True)
class SuiteShare:
    sessions: list[AgentResult]
    lost: str | None


class SuiteWorker(ClockedActor):
    """A Ray async actor that runs its share of each suite level it is given (see the module)."""

    def __init__(self, index: int, count: int, endpoint: Endpoint) -> None:
        self.index = index
        self.count = count
        self.endpoint = endpoint
        self._task: asyncio.Task[LoadOutcome] | None = None
        self._conn: Connection | None = None
        self._finished: list[tuple[str, TestResult]] = []
        self._sessions: list[AgentResult] = []

    async def start(self, test_ids: Sequence[str], agents: int, config: SuiteConfig, run_id: str) -> int:
        # The tests by id, built here from this actor's agentload: a test holds its scorers (code, not data).
        tests = select(test_ids, payload_tokens=config.payload_tokens)
        clock = LoopClock()
        self._conn = await connect_endpoint(self.endpoint, clock=clock)
        self._finished, self._sessions = [], []
        acc = LevelAccumulator(agents, tests, clock.now())
        acc.sessions = self._sessions  # the sessions this actor finishes, handed over at the end
        width = len(str(agents - 1))
        ids = [f"agent-{i:0{width}d}" for i in range(self.index, agents, self.count)]
        drivers = [SuiteSession(a, tests, functools.partial(self._test_done, a)) for a in ids]
        ctx = LevelContext(self._conn.backend, config, clock, acc, run_id)
        load = run_load([ConversationDriver(d) for d in drivers], ctx, liveness=self._conn.liveness, clock=clock)
        self._task = asyncio.ensure_future(load)
        return len(ids)

    def _test_done(self, agent: str, _level: int, result: TestResult) -> None:
        self._finished.append((agent, result))

    async def take(self) -> tuple[list[tuple[str, TestResult]], bool]:
        out = self._finished[:]
        self._finished.clear()
        return out, self._task is None or self._task.done()

    async def finish(self) -> tuple[list[tuple[str, TestResult]], SuiteShare]:
        if self._task is None or self._conn is None:
            raise RuntimeError("finish() before start()")
        try:
            outcome = await self._task
        finally:
            await self._conn.aclose()
        rest = self._finished[:]
        self._finished.clear()
        return rest, SuiteShare(list(self._sessions), outcome.lost)


@dataclass
class RaySuite:
    """Suite levels over a cluster of ``SuiteWorker``s (``suite.runner.RemoteLevels``)."""

    cluster: RayCluster

    async def run_level(
        self, tests: Sequence[SuiteTest], agents: int, config: SuiteConfig, run_id: str, on_test: TestDone | None
    ) -> tuple[list[AgentResult], int, str | None]:
        return await _run_level(self.cluster, tests, agents, config, run_id, on_test)


async def _run_level(
    cluster: RayCluster,
    tests: Sequence[SuiteTest],
    agents: int,
    config: SuiteConfig,
    run_id: str,
    on_test: TestDone | None,
) -> tuple[list[AgentResult], int, str | None]:
    """The level's sessions over the cluster's actors: (sessions, tests finished, why the server was lost or None)."""
    actors = cluster.actors
    dead = dead_actor_errors(cluster.ray)
    alive = list(range(len(actors)))
    received: dict[str, list[TestResult]] = {}
    lost_actors: dict[int, str] = {}
    tests_done = 0

    def keep(pairs: list[tuple[str, TestResult]]) -> None:
        nonlocal tests_done
        for agent, result in pairs:
            received.setdefault(agent, []).append(result)
            tests_done += 1
            if on_test is not None:
                on_test(agents, result)

    async def each(name: str, *args: object) -> dict[int, Any]:
        results = await asyncio.gather(*(getattr(actors[i], name).remote(*args) for i in alive),
                                       return_exceptions=True)  # fmt: skip
        out: dict[int, Any] = {}
        for i, r in zip(list(alive), results, strict=True):
            if isinstance(r, dead):
                alive.remove(i)
                lost_actors[i] = str(r).strip().splitlines()[0] if str(r).strip() else type(r).__name__
            elif isinstance(r, BaseException):
                raise r
            else:
                out[i] = r
        if not alive:
            raise ExecutorError("every Ray actor died; the suite's finished levels are kept")
        return out

    await each("start", [t.id for t in tests], agents, config, run_id)
    while True:
        batches = await each("take")
        for pairs, _ in batches.values():  # (pairs, done): SuiteWorker.take
            keep(pairs)
        if all(done for _, done in batches.values()):
            break
        await asyncio.sleep(PULL_INTERVAL_S)
    sessions: list[AgentResult] = []
    lost: str | None = None
    for rest, share in (await each("finish")).values():
        keep(rest)
        sessions.extend(share.sessions)
        lost = lost or share.lost
    width = len(str(agents - 1))
    for i, why in lost_actors.items():
        for n in range(i, agents, len(actors)):
            agent = f"agent-{n:0{width}d}"
            error = f"its Ray actor ({i}) died: {why}"
            sessions.append(AgentResult(agent_id=agent, status=AgentStatus.FAILED, session_s=0.0, error=error,
                                        tests=received.get(agent, [])))  # fmt: skip
    sessions.sort(key=lambda s: s.agent_id)
    return sessions, tests_done, lost
