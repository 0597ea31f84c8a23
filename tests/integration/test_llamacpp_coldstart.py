"""A real llama-server cold start under the stall watchdog: agents sent while the server is still starting.

Unlike vLLM (whose port stays closed until the engine is up), llama-server listens at once and answers /health
503 ("Loading model") while it loads; then 200. The agents here are started at launch and gated on
``SignalPoller.wait_until_ready``, as a fleet's first turns are; one more request goes straight in through the
retrying backend and watchdog the bench runner uses, and what becomes of it is recorded. With this tier's small
model the loading window is short (well under a second of 503s after the port opens), so the test checks that
the gate holds the agents until ready and that every one of them completes, not how long loading takes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.endpoint.retry import RetryingBackend
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.watchdog import Watchdog
from agentload.errors import EndpointTimeoutError
from tests.integration.llamacpp import ALIAS, FIGURES, START_TIMEOUT_S, TIMINGS, Tier, launch, tail, wait_healthy

AGENTS = 3
TURNS = 2


async def test_agents_started_during_a_cold_start_all_complete(llamacpp_tier: Tier) -> None:
    server = launch(llamacpp_tier, "coldstart", slots=2, slot_context=2048)
    launched = time.monotonic()
    seen: list[int | None] = []
    try:
        poller = SignalPoller(server.url, engine="llamacpp", interval_s=0.1)
        await poller.start()
        dog = Watchdog(signals=poller)
        client = ChatClient(server.url, policy=dog)
        backend = RetryingBackend(client, policy=dog)

        async def ready() -> None:
            while True:
                seen.append(await asyncio.to_thread(server.health))
                try:
                    await poller.wait_until_ready(1.0)
                    return
                except EndpointTimeoutError:
                    if not server.alive():
                        pytest.fail(f"llama-server exited during the cold start:\n{tail(server.log)}")
                    if time.monotonic() - launched > START_TIMEOUT_S:
                        pytest.fail(f"llama-server not ready after {START_TIMEOUT_S:g} s:\n{tail(server.log)}")

        gate = asyncio.ensure_future(ready())

        async def agent(i: int) -> list[RequestRecord]:
            records: list[RequestRecord] = []
            sent_before_ready = not gate.done()
            await gate
            for turn in range(TURNS):
                body = {"model": ALIAS, "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"agent {i} turn {turn} read the file"}]}  # fmt: skip
                records += await backend.complete(body, RequestIds(agent=str(i), turn=turn))
            assert sent_before_ready
            return records

        async def ungated() -> tuple[list[RequestRecord], float]:
            began = time.monotonic()
            body = {"model": ALIAS, "max_tokens": 16, "messages": [{"role": "user", "content": "too early"}]}
            direct = await backend.complete(body, RequestIds(agent="ungated"))
            return direct, time.monotonic() - began

        try:
            fleet, (direct, direct_s) = await asyncio.gather(
                asyncio.gather(*(agent(i) for i in range(AGENTS))), ungated()
            )
        finally:
            gate.cancel()
            await client.aclose()
            await poller.stop()
        ready_after = time.monotonic() - launched
        wait_healthy(server, timeout_s=10)
    finally:
        server.stop()
    TIMINGS["cold start (launch to ready, second server)"] = ready_after
    outcomes = [r.outcome for records in fleet for r in records]
    stats = dog.statistics()
    FIGURES["cold start"] = (
        f"ready after {ready_after:.2f} s (/health seen: {seen}); {AGENTS} gated agents × {TURNS} turns: "
        f"{sum(o is Outcome.OK for o in outcomes)}/{len(outcomes)} requests OK; the ungated request: "
        f"{len(direct)} attempts, last {direct[-1].outcome.value} ({direct[-1].error}) after {direct_s:.2f} s; "
        f"watchdog granted {stats.granted}, refused {stats.refused}"
    )
    assert outcomes == [Outcome.OK] * (AGENTS * TURNS), FIGURES["cold start"]
    assert stats.refused.get("dead_server", 0) <= 1, FIGURES["cold start"]  # only the ungated one may be
