"""A real vLLM cold start under the stall watchdog: agents sent while the server is still loading.

vLLM serves no HTTP at all until the model is loaded and the engine is up (its /health never answers 503; the
port is simply closed), so no per-request rule can tell a loading vLLM from a dead one: a connection is refused
either way. What agentload offers for it is ``SignalPoller.wait_until_ready``, polled until /health says 200,
then the watchdog for the requests themselves. This test launches a second server, starts agents at once (the
first request of each is issued before /health is ready and held at the poller's gate), and checks that every
agent completes; alongside, one request is sent straight into the closed port through the same watchdog and
retrying backend the bench runner uses, and what becomes of it is recorded (it is given up, by design: that is
why the gate exists).
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
from tests.integration.conftest import FIGURES, MODEL, START_TIMEOUT_S, TIMINGS, launch, tail, wait_healthy

AGENTS = 4
TURNS = 3


async def test_agents_started_during_a_cold_start_all_complete(vllm_tier: object) -> None:
    # vLLM refuses to start with a pool that cannot hold one max-length request (plus a block it keeps back).
    server = launch(96, "coldstart", cores="1")  # core 0 is the session server's
    launched = time.monotonic()
    try:
        poller = SignalPoller(server.url, engine="vllm", interval_s=0.5)
        await poller.start()
        dog = Watchdog(signals=poller)
        client = ChatClient(server.url, policy=dog)
        backend = RetryingBackend(client, policy=dog)

        async def ready() -> None:
            # wait_until_ready in short slices, so a server that died while loading fails the test at once
            # instead of after the whole start timeout.
            while True:
                try:
                    await poller.wait_until_ready(2.0)
                    return
                except EndpointTimeoutError:
                    if not server.alive():
                        pytest.fail(f"vLLM exited during the cold start:\n{tail(server.log)}")
                    if time.monotonic() - launched > START_TIMEOUT_S:
                        pytest.fail(f"vLLM not ready after {START_TIMEOUT_S:g} s:\n{tail(server.log)}")

        gate = asyncio.ensure_future(ready())

        async def agent(i: int) -> list[RequestRecord]:
            records: list[RequestRecord] = []
            sent_before_ready = not gate.done()
            await gate
            for turn in range(TURNS):
                body = {"model": MODEL, "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"agent {i} turn {turn} read the file"}]}  # fmt: skip
                records += await backend.complete(body, RequestIds(agent=str(i), turn=turn))
            assert sent_before_ready
            return records

        async def ungated() -> tuple[list[RequestRecord], float]:
            began = time.monotonic()
            body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "too early"}]}
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
        assert server.alive(), tail(server.log)
        wait_healthy(server, timeout_s=10)  # ready now, so at once
    finally:
        server.stop()
    TIMINGS["cold start (launch to ready, second server)"] = ready_after
    outcomes = [r.outcome for records in fleet for r in records]
    stats = dog.statistics()
    FIGURES["cold start"] = (
        f"ready after {ready_after:.1f} s; {AGENTS} gated agents × {TURNS} turns: "
        f"{sum(o is Outcome.OK for o in outcomes)}/{len(outcomes)} requests OK; the ungated request: "
        f"{len(direct)} attempts, last {direct[-1].outcome.value} ({direct[-1].error}), given up after "
        f"{direct_s:.1f} s, backend gave up {backend.stats.gave_up}; watchdog granted {stats.granted}, "
        f"refused {stats.refused}"
    )
    assert outcomes == [Outcome.OK] * (AGENTS * TURNS), FIGURES["cold start"]
    assert ready_after > 5  # the agents really started on a server that was not up
    assert stats.refused.get("dead_server", 0) <= 1  # only the ungated request may be given up as dead
