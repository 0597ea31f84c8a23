"""A fleet started against a server that is still starting, gated on ``SignalPoller.wait_until_ready``.

The agents are started at launch and wait at the poller's gate, as a fleet's first turns do; one more request goes
straight in through the retrying backend and watchdog the bench runner uses, and what becomes of it is recorded.
What each engine looks like while it starts differs (vLLM's port stays closed until it is up; llama-server listens
at once and answers /health 503 while it loads), so what the outcome must be is the tier's test to say.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from agentload.endpoint.backend import RetryingBackend, RetryStatistics
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.watchdog import Watchdog, WatchdogStatistics
from agentload.errors import EndpointTimeoutError
from tests.integration.harness.process import Server, tail, wait_ready


@dataclass(frozen=True)
class ColdStart:
    """What a cold start came to: when the server was ready, the gated fleet's records, the ungated request's."""

    ready_after_s: float  # launch to the poller's ready
    health_seen: list[int | None]  # /health's status at each of the gate's slices (None: not listening)
    fleet: list[list[RequestRecord]]  # per agent
    direct: list[RequestRecord]  # the ungated request's attempts
    direct_s: float
    watchdog: WatchdogStatistics
    backend: RetryStatistics

    def outcomes(self) -> list[Outcome]:
        return [r.outcome for records in self.fleet for r in records]

    def text(self) -> str:
        """The tier figure: when it was ready, what /health said meanwhile, and what became of every request."""
        outcomes, last, seen = self.outcomes(), self.direct[-1], run_lengths(self.health_seen)
        turns = len(outcomes) // max(len(self.fleet), 1)
        return (
            f"ready after {self.ready_after_s:.2f} s (/health seen: {seen}); {len(self.fleet)} gated agents × "
            f"{turns} turns: {sum(o is Outcome.OK for o in outcomes)}/{len(outcomes)} requests OK; "
            f"the ungated request: {len(self.direct)} attempts, last {last.outcome.value} ({last.error}) after "
            f"{self.direct_s:.2f} s, backend gave up {self.backend.gave_up}; watchdog granted "
            f"{self.watchdog.granted}, refused {self.watchdog.refused}"
        )


def run_lengths(seen: list[int | None]) -> str:
    """``[None, None, 503, 200]`` as ``None ×2, 503, 200``: a slow start polls /health dozens of times."""
    out: list[str] = []
    i = 0
    while i < len(seen):
        j = i
        while j < len(seen) and seen[j] == seen[i]:
            j += 1
        out.append(f"{seen[i]} ×{j - i}" if j - i > 1 else str(seen[i]))
        i = j
    return ", ".join(out) or "-"


async def cold_start(server: Server, signals: str, *, agents: int, turns: int, poll_s: float,
                     slice_s: float, keep: bool = False) -> ColdStart:  # fmt: skip
    """Run ``agents`` gated agents of ``turns`` turns and one ungated request from launch; stops ``server`` after
    (``keep``: only when the cold start failed, so a session fixture can serve on from the server it started).

    The gate waits in ``slice_s`` slices, so a server that dies while loading fails the test at once instead of
    after the whole start timeout.
    """
    name, limit = server.engine.name, server.engine.start_timeout_s
    seen: list[int | None] = []
    started = False
    try:
        poller = SignalPoller(server.url, engine=signals, interval_s=poll_s)
        await poller.start()
        dog = Watchdog(signals=poller)
        client = ChatClient(server.url, policy=dog)
        backend = RetryingBackend(client, policy=dog)

        async def ready() -> None:
            while True:
                seen.append(await asyncio.to_thread(server.health))
                try:
                    await poller.wait_until_ready(slice_s)
                    return
                except EndpointTimeoutError:
                    if not server.alive():
                        pytest.fail(f"{name} exited during the cold start:\n{tail(server.log)}")
                    if time.monotonic() - server.launched > limit:
                        pytest.fail(f"{name} not ready after {limit:g} s:\n{tail(server.log)}")

        gate = asyncio.ensure_future(ready())

        async def agent(i: int) -> list[RequestRecord]:
            records: list[RequestRecord] = []
            sent_before_ready = not gate.done()
            await gate
            for turn in range(turns):
                body = {"model": server.model, "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"agent {i} turn {turn} read the file"}]}  # fmt: skip
                records += await backend.complete(body, RequestIds(agent=str(i), turn=turn))
            assert sent_before_ready
            return records

        async def ungated() -> tuple[list[RequestRecord], float]:
            began = time.monotonic()
            body = {"model": server.model, "max_tokens": 16, "messages": [{"role": "user", "content": "too early"}]}
            direct = await backend.complete(body, RequestIds(agent="ungated"))
            return direct, time.monotonic() - began

        try:
            fleet, (direct, direct_s) = await asyncio.gather(
                asyncio.gather(*(agent(i) for i in range(agents))), ungated()
            )
        finally:
            gate.cancel()
            await client.aclose()
            await poller.stop()
        ready_after = time.monotonic() - server.launched
        assert server.alive(), tail(server.log)
        wait_ready(server, timeout_s=10)  # ready now, so at once
        started = True
    finally:
        if not (keep and started):
            server.stop()
    return ColdStart(ready_after_s=ready_after, health_seen=seen, fleet=list(fleet), direct=direct,
                     direct_s=direct_s, watchdog=dog.statistics(), backend=backend.stats)  # fmt: skip
