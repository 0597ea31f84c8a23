"""A real vLLM cold start under the stall watchdog: agents sent while the server is still loading.

vLLM serves no HTTP at all until the model is loaded and the engine is up (its /health never answers 503; the
port is simply closed), so no per-request rule can tell a loading vLLM from a dead one: a connection is refused
either way. What agentload offers for it is ``SignalPoller.wait_until_ready``, polled until /health says 200,
then the watchdog for the requests themselves. The cold start is the SmolLM2 session server's launch
(``smollm2_cold_start`` in vllm.py): agents start at once (the first request of each is issued before /health is
ready and held at the poller's gate), and every agent must complete; alongside, one request is sent straight into
the closed port through the same watchdog and retrying backend the bench runner uses, and what becomes of it is
recorded (it is given up, by design: that is why the gate exists).
"""

from __future__ import annotations

from agentload.endpoint.records import Outcome
from tests.integration.harness.coldstart import ColdStart
from tests.integration.vllm import COLD_AGENTS, COLD_TURNS, FIGURES, VllmServer


def test_agents_started_during_a_cold_start_all_complete(smollm2_cold_start: tuple[VllmServer, ColdStart]) -> None:
    # The SmolLM2 server's start (vllm.py): it serves the trained-model tests after.
    _, run = smollm2_cold_start
    FIGURES["cold start (SmolLM2)"] = run.text()
    assert run.outcomes() == [Outcome.OK] * (COLD_AGENTS * COLD_TURNS), FIGURES["cold start (SmolLM2)"]
    assert run.ready_after_s > 5  # the agents really started on a server that was not up
    assert run.watchdog.refused.get("dead_server", 0) <= 1  # only the ungated request may be given up as dead
