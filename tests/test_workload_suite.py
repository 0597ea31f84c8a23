"""The behaviour suite as a load: passes reported with their scores, the level's end noticed between tests."""

from __future__ import annotations

import pytest

from agentload.errors import ConfigError
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.faults import parse_fault
from agentload.suite.app import oracle_book
from agentload.workload.suite import SuiteWorkload
from tests.test_workload_harness import run_level, sim_server


def oracle(known_bad: str | None = None) -> OracleBehaviour:
    return OracleBehaviour(oracle_book(), known_bad=known_bad)


def test_every_agent_passes_every_test_against_the_oracle() -> None:
    # T11's default payload (200,000 characters of JSON lines) is about 100,000 tokens on a BPE tokenizer, as the
    # simulator counts it: past this profile's 40,960-token context. A payload of 60,000 characters fits.
    workload = SuiteWorkload(payload_tokens=15_000)
    run = run_level(workload, 2, context=0, duration_s=25.0, server=sim_server(behaviour=oracle()))
    assert {s.agent_id for s in run.sessions} == {"agent-0", "agent-1"}
    # A pass takes ~8 virtual seconds (tool schemas, JSON results and tool calls cost what BPE makes of them).
    assert len(run.sessions) >= 4
    assert all(s.ok and s.passed == s.scored for s in run.sessions)
    assert [s.scored for s in run.sessions[:4]] == [17] * 4  # T1–T17: the H1 relay is reported on its own
    # Requests carry the bench's level and one conversation per pass and test.
    assert {r.ids.level for r in run.records} == {0}
    assert {"agent-0/p0/T1", "agent-0/p1/T1", "agent-0/p0/H1"} <= {r.ids.agent for r in run.records}


def test_the_level_end_is_noticed_between_tests() -> None:
    # Stop after the 10th request: mid-way through the basic tests of the first pass.
    run = run_level(SuiteWorkload(), 1, context=0, stop_after_requests=10, server=sim_server(behaviour=oracle()))
    (cut,) = run.sessions
    # The pass is reported with the tests it finished (the one in flight completes), and no test was started later.
    assert cut.ok
    assert 2 <= (cut.scored or 0) < 18
    assert cut.passed == cut.scored
    started = {r.ids.agent.rsplit("/", 1)[1] for r in run.records}
    assert len(started) == cut.scored


def test_a_model_that_refuses_everything_scores_low() -> None:
    run = run_level(
        SuiteWorkload(tests="T1,T2,T3"), 1, context=0, duration_s=1.0, server=sim_server(behaviour=oracle("refuse"))
    )
    first = run.sessions[0]
    assert first.ok
    assert first.scored == 3
    assert first.passed == 0


def test_unscored_tests_count_against_the_pass_rate() -> None:
    server = sim_server(behaviour=oracle(), faults=[parse_fault("http503:1")])
    run = run_level(SuiteWorkload(tests=["T1", "T2"]), 1, context=0, duration_s=5.0, server=server)
    # Every request fails: nothing could be judged, and the seed counts that as not passed.
    assert run.sessions[0].scored == 2
    assert run.sessions[0].passed == 0
    # Failing takes no time on a dead server; the agent pauses a second instead of spinning through the suite.
    assert len(run.sessions) <= 3


def test_unknown_test_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown test id T99"):
        SuiteWorkload(tests="T1,T99")
