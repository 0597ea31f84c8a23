"""A real llama-server cold start under the stall watchdog: agents sent while the server is still starting.

Unlike vLLM (whose port stays closed until the engine is up), llama-server listens at once and answers /health
503 ("Loading model") while it loads; then 200. The agents here are started at launch and gated on
``SignalPoller.wait_until_ready``, as a fleet's first turns are; one more request goes straight in through the
retrying backend and watchdog the bench runner uses, and what becomes of it is recorded. With this tier's small
model the loading window is short (well under a second of 503s after the port opens), so the test checks that
the gate holds the agents until ready and that every one of them completes, not how long loading takes.
"""

from __future__ import annotations

from agentload.endpoint.records import Outcome
from tests.integration.harness.coldstart import cold_start
from tests.integration.llamacpp import FIGURES, TIMINGS, Tier, launch

AGENTS = 3
TURNS = 2


async def test_agents_started_during_a_cold_start_all_complete(llamacpp_tier: Tier) -> None:
    server = launch(llamacpp_tier, "coldstart", slots=2, slot_context=2048)
    run = await cold_start(server, "llamacpp", agents=AGENTS, turns=TURNS, poll_s=0.1, slice_s=1.0)
    TIMINGS["cold start (launch to ready, second server)"] = run.ready_after_s
    FIGURES["cold start"] = run.text()
    assert run.outcomes() == [Outcome.OK] * (AGENTS * TURNS), FIGURES["cold start"]
    assert run.watchdog.refused.get("dead_server", 0) <= 1, FIGURES["cold start"]  # only the ungated one may be
