"""Runs one load level: N agents of a workload against a target, sampled, recorded, then summarised.

A level is warm-up + measurement window: agents start staggered over the first second, run closed-loop until the
level's time is up, finish the turn in flight (within a grace period, then are cancelled), and everything they
did is in ``LevelData`` — records and server samples — for ``analysis.summarise``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from agentload.agent.loop import ChatBackend
from agentload.bench.analysis import LevelData
from agentload.bench.sampler import MetricsSampler
from agentload.bench.target import Target
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.endpoint.retry import RetryingBackend
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.watchdog import Watchdog
from agentload.vtime import LoopClock
from agentload.workload.base import Workload

RecordSink = Callable[[RequestRecord], None]


class RecordingBackend:
    """Passes turns to the inner backend and keeps every attempt's record."""

    def __init__(self, inner: ChatBackend, records: list[RequestRecord], sink: RecordSink | None = None) -> None:
        self.inner = inner
        self.records = records
        self.sink = sink

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        attempts = await self.inner.complete(body, ids)
        self.records.extend(attempts)
        if self.sink is not None:
            for r in attempts:
                self.sink(r)
        return attempts


class _Context:
    """The LoadContext a level gives its agents."""

    def __init__(self, backend: ChatBackend, model: str, run_id: str, level: int, stop_at: float, data: LevelData):
        self.backend = backend
        self.clock = LoopClock()
        self.model = model
        self.run_id = run_id
        self.level = level
        self._stop_at = stop_at
        self._data = data

    def should_stop(self) -> bool:
        return self.clock.now() >= self._stop_at

    def session_done(self, agent_id: str, *, ok: bool, passed: int | None = None, scored: int | None = None) -> None:
        if ok:
            self._data.sessions_ok += 1
        else:
            self._data.sessions_failed += 1
        if passed is not None and scored is not None:
            self._data.passed += passed
            self._data.scored += scored


async def run_level(
    target: Target,
    workload: Workload,
    *,
    agents: int,
    context: int,
    level: int,
    run_id: str,
    run_t0: float,
    warmup_s: float,
    window_s: float,
    grace_s: float = 60.0,
    seed: int = 0,
    sink: RecordSink | None = None,
) -> LevelData:
    """Run ``agents`` agents for warm-up + window seconds of the target's clock; return what they did."""
    clock = LoopClock()
    start = clock.now() - run_t0
    data = LevelData(level, agents, context, workload.name, start, start + warmup_s, start + warmup_s + window_s,
                     t0=run_t0)  # fmt: skip
    # The watchdog tells a cold start or a long prefill from a dead server (it reads the server's own signals),
    # and the retrying backend resends a turn that hit a transient failure; every attempt is recorded.
    poller = SignalPoller(target.base_url, transport=target.transport, clock=clock)
    await poller.start()
    policy = Watchdog(signals=poller, clock=clock)
    client = ChatClient(target.base_url, transport=target.transport, policy=policy)
    backend = RecordingBackend(RetryingBackend(client, policy=policy, clock=clock), data.records, sink)
    ctx = _Context(backend, target.model, run_id, level, run_t0 + data.end, data)
    drivers = workload.agents(agents, context=context, seed=seed + 7919 * level)
    sampler = MetricsSampler(target.transport, target.base_url, t0=run_t0)
    sampler.start()

    async def start_later(i: int) -> None:
        # Stagger starts over the first second so agents do not move in lockstep.
        await asyncio.sleep(i / max(1, agents))
        await drivers[i].run(ctx)

    tasks = [asyncio.ensure_future(start_later(i)) for i in range(len(drivers))]
    try:
        # Samples exactly at the window's edges, so counter deltas cover the window and nothing else.
        await asyncio.sleep(max(0.0, run_t0 + data.window_start - clock.now()))
        await sampler.sample_once()
        await asyncio.sleep(max(0.0, run_t0 + data.end - clock.now()))
        await sampler.sample_once()
        _, pending = await asyncio.wait(tasks, timeout=grace_s) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for t in tasks:
            t.cancel()
        await sampler.stop()
        await poller.stop()
    data.samples = sampler.samples
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            # A driver bug is a run-level failure, raised after cleanup (per-request failures are data).
            raise t.exception()  # type: ignore[misc]  # checked not None just above
    return data
