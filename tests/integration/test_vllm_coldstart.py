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

from agentload.endpoint.records import Outcome
from tests.integration.harness.coldstart import cold_start
from tests.integration.vllm import FIGURES, TIMINGS, launch

AGENTS = 4
TURNS = 3


async def test_agents_started_during_a_cold_start_all_complete(vllm_tier: object) -> None:
    # vLLM refuses to start with a pool that cannot hold one max-length request (plus a block it keeps back).
    server = launch(96, "coldstart", cores="1")  # core 0 is the session server's
    run = await cold_start(server, "vllm", agents=AGENTS, turns=TURNS, poll_s=0.5, slice_s=2.0)
    TIMINGS["cold start (launch to ready, second server)"] = run.ready_after_s
    FIGURES["cold start"] = run.text()
    assert run.outcomes() == [Outcome.OK] * (AGENTS * TURNS), FIGURES["cold start"]
    assert run.ready_after_s > 5  # the agents really started on a server that was not up
    assert run.watchdog.refused.get("dead_server", 0) <= 1  # only the ungated request may be given up as dead
