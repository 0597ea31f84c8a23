"""A load level in virtual time for the workload tests: the simulator in process, a LoadContext, the records.

The bench's own runner is not a dependency of these tests: this is the smallest LoadContext the contract
(workload/base.py) describes — a recording backend, the loop's clock, a stop time — so each workload is tested
against the contract alone. The tests here pin that the harness itself behaves as the contract says.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentload.capacity.profile import load_profile
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.backend import SingleAttemptBackend
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.workload.base import Workload
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing

PROFILE = "qwen3-235b-gb300"  # 40,960-token max_model_len, a pool of ~1M tokens: no eviction at test sizes


@dataclass(frozen=True)
class SessionReport:
    agent_id: str
    ok: bool
    passed: int | None
    scored: int | None
    at: float


class RecordingBackend:
    """One attempt per turn (no retries), every record and request body kept in arrival order."""

    def __init__(self, client: ChatClient) -> None:
        self._inner = SingleAttemptBackend(client)
        self.records: list[RequestRecord] = []
        self.bodies: list[Mapping[str, Any]] = []

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        self.bodies.append(body)
        out = await self._inner.complete(body, ids)
        self.records.extend(out)
        return out


@dataclass
class Level:
    """A LoadContext: the level ends (``should_stop``) at ``stop_at`` on the loop's clock, or once
    ``stop_after_requests`` requests were sent (a stop point that does not depend on how fast the server is)."""

    backend: RecordingBackend
    model: str
    stop_at: float
    stop_after_requests: float = math.inf
    run_id: str = "test-run"
    level: int = 0
    clock: LoopClock = field(default_factory=LoopClock)
    sessions: list[SessionReport] = field(default_factory=list)
    sizing: TokenSizing = SIMULATOR_SIZING
    drawn: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def text_salt(self) -> str:
        return self.run_id

    def should_stop(self) -> bool:
        return self.clock.now() >= self.stop_at or len(self.backend.records) >= self.stop_after_requests

    def session_done(self, agent_id: str, *, ok: bool, passed: int | None = None, scored: int | None = None) -> None:
        self.sessions.append(SessionReport(agent_id, ok, passed, scored, self.clock.now()))

    def reply_clamped(self, ids: RequestIds, drawn: int) -> None:
        self.drawn[(ids.agent, ids.turn)] = drawn


@dataclass(frozen=True)
class LevelRun:
    records: list[RequestRecord]
    sessions: list[SessionReport]
    ended_at: float  # virtual seconds after the level started
    bodies: list[Mapping[str, Any]]


def sim_server(profile: str = PROFILE, **config: Any) -> SimServer:
    return SimServer(SimConfig(profile=load_profile(profile), **config))


async def run_level_async(
    server: SimServer,
    workload: Workload,
    count: int,
    *,
    context: int,
    duration_s: float = math.inf,
    seed: int = 0,
    level: int = 0,
    run_id: str = "test-run",
    stop_after_requests: float = math.inf,
) -> LevelRun:
    client = ChatClient("http://sim.invalid", transport=InProcessTransport(server), api_key_env=None)
    try:
        clock = LoopClock()
        start = clock.now()
        ctx = Level(RecordingBackend(client), server.model_name, start + duration_s, stop_after_requests,
                    run_id=run_id, level=level)  # fmt: skip
        drivers = workload.agents(count, context=context, seed=seed)
        await asyncio.gather(*(d.run(ctx) for d in drivers))
        return LevelRun(ctx.backend.records, ctx.sessions, clock.now() - start, ctx.backend.bodies)
    finally:
        await client.aclose()


def run_level(
    workload: Workload,
    count: int,
    *,
    context: int,
    duration_s: float = math.inf,
    seed: int = 0,
    server: SimServer | None = None,
    stop_after_requests: float = math.inf,
) -> LevelRun:
    """One level on a fresh (or the given) simulated server, in virtual time."""
    level = run_level_async(server or sim_server(), workload, count, context=context, duration_s=duration_s,
                            seed=seed, stop_after_requests=stop_after_requests)  # fmt: skip
    run: LevelRun = run_virtual(level)
    return run


def hit_rate(records: Sequence[RequestRecord]) -> float:
    """Prefix-cache hit rate from usage: cached prompt tokens over prompt tokens."""
    prompt = sum(r.prompt_tokens for r in records)
    return sum(r.cached_tokens or 0 for r in records) / prompt if prompt else 0.0


# -- the harness itself ------------------------------------------------------------------------------------------


@dataclass
class _Pinger:
    """A driver that sends one tiny request a virtual second until the level stops."""

    agent_id: str

    async def run(self, ctx: Any) -> None:
        turn = 0
        while not ctx.should_stop():
            body = {"model": ctx.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
            ids = RequestIds(run=ctx.run_id, level=ctx.level, agent=self.agent_id, turn=turn)
            await ctx.backend.complete(body, ids)
            turn += 1
            await ctx.clock.sleep(1.0)
        ctx.session_done(self.agent_id, ok=True)


@dataclass
class _Pings:
    name: str = "pings"

    def agents(self, count: int, *, context: int, seed: int) -> list[Any]:
        return [_Pinger(f"p{i}") for i in range(count)]


def test_harness_stops_the_level_on_time_and_keeps_every_record() -> None:
    run = run_level(_Pings(), 3, context=1024, duration_s=10.0)
    assert [s.agent_id for s in run.sessions] == ["p0", "p1", "p2"]
    # Ten virtual seconds at one request a second each (the reply itself takes a few milliseconds).
    assert 27 <= len(run.records) <= 33
    assert all(r.ok for r in run.records)
    assert 10.0 <= run.ended_at < 11.5
