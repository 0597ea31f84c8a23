"""The suite against the simulated server: the oracle passes everything at 1 and 64 agents, every known-bad
behaviour fails its test, the relay reports its break hop, stored results re-score identically."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentload.clock import LoopClock, RealClock, run_virtual
from agentload.endpoint.backend import RetryingBackend, SingleAttemptBackend
from agentload.endpoint.client import ChatClient, FixedDeadlines
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.sim.behaviour import Behaviour, OracleBehaviour
from agentload.sim.faults import parse_fault
from agentload.store.runstore import save_suite_run as save_run
from agentload.suite.app import oracle_book
from agentload.suite.cases import all_tests, by_id, select
from agentload.suite.model import SuiteTest, failed
from agentload.suite.oracle import STOP_EARLY_AFTER, WRONG_KEY_AT, scenarios
from agentload.suite.results import AgentStatus, SuiteRun, load_run, rescore
from agentload.suite.runner import SuiteConfig, run_suite
from agentload.suite.scoring import Status
from tests.simserver import running_sim

KNOWN_BAD = [(s.id, name) for s in scenarios() for name in sorted(s.bad)]


async def run_on_sim(
    tests: Sequence[SuiteTest],
    agents: int = 1,
    behaviour: Behaviour | None = None,
    *,
    api_key_env: str | None = None,
    **sim: Any,
) -> SuiteRun:
    behaviour = behaviour or OracleBehaviour(oracle_book())
    async with running_sim(behaviour=behaviour, **sim) as (server, url):
        client = ChatClient(url, api_key_env=api_key_env)
        try:
            config = SuiteConfig(model=server.model_name)
            return await run_suite(SingleAttemptBackend(client), tests, config, [agents], RealClock(), endpoint=url)
        finally:
            await client.aclose()


def test_the_oracle_book_registers_every_suite_test_with_a_known_bad() -> None:
    book = oracle_book()
    for test in all_tests():
        scenario = book.get(test.id)
        assert scenario is not None, test.id
        assert scenario.bad, f"{test.id} has no known-bad behaviour"
    assert {s.id for s in scenarios()} == {t.id for t in all_tests()}


async def test_oracle_passes_the_whole_suite_with_one_agent() -> None:
    run = await run_on_sim(all_tests())
    level = run.levels[0]
    assert level.pooled_pass_rate == 1.0
    assert [s.pass_rate for s in level.per_test] == [1.0] * 18
    assert (level.completed, level.unscored, level.failed) == (1, 0, 0)
    # The oracle's turns, test by test: 7 basic, 6 parallel, 8 stress, 9 instruction, 5 edge, 50 hops + answer.
    assert level.requests == 86
    assert level.requests_failed == 0
    assert level.ttft_p50_s is not None
    assert level.ttft_p95_s is not None
    assert 0 < level.ttft_p50_s <= level.ttft_p95_s
    assert level.median_session_s is not None
    assert 0 < level.median_session_s <= level.wall_clock_s
    result = level.agent_results[0].tests[0]
    assert result.suite_version == result.played_version == run.suite_version
    assert result.transcript.turns, "the transcript is kept whole"


@pytest.mark.slow
async def test_oracle_passes_the_whole_suite_with_sixty_four_agents() -> None:
    run = await run_on_sim(all_tests(), agents=64)
    level = run.levels[0]
    assert level.pooled_pass_rate == 1.0
    assert all(s.passed == 64 for s in level.per_test)
    assert (level.completed, level.unscored, level.failed) == (64, 0, 0)
    assert level.requests == 64 * 86
    assert len({a.agent_id for a in level.agent_results}) == 64


@pytest.mark.parametrize(("test_id", "bad"), KNOWN_BAD, ids=[f"{t}-{b}" for t, b in KNOWN_BAD])
async def test_each_known_bad_behaviour_fails_its_test(test_id: str, bad: str) -> None:
    run = await run_on_sim(select([test_id]), behaviour=OracleBehaviour(oracle_book(), known_bad=bad))
    result = run.levels[0].agent_results[0].tests[0]
    assert result.status is Status.FAIL, result.reason
    assert run.levels[0].per_test[0].pass_rate == 0.0


# What the two cheats (echo-result, placeholder-args) passed before the scorers were closed against them (suite 1.0).
CHEATS_PASSED_BEFORE = {
    "echo-result": ["T1", "T2", "T4", "T5", "T8", "T9", "T10", "T12", "T14"],
    "placeholder-args": ["T4"],
}


@pytest.mark.parametrize("cheat", sorted(CHEATS_PASSED_BEFORE))
async def test_the_two_cheats_fail_every_scored_test(cheat: str) -> None:
    # Raw tool results handed back as the answer; offered tools called with placeholders and an invented outcome.
    scored = [t for t in all_tests() if t.id != "H1"]
    run = await run_on_sim(scored, behaviour=OracleBehaviour(oracle_book(), known_bad=cheat))
    results = run.levels[0].agent_results[0].tests
    assert {r.test_id: r.status for r in results} == {t.id: Status.FAIL for t in scored}
    assert set(CHEATS_PASSED_BEFORE[cheat]) <= {r.test_id for r in results}
    assert run.levels[0].pooled_pass_rate == 0.0


@pytest.mark.parametrize(("bad", "hop"), [("stop-early", STOP_EARLY_AFTER + 1), ("wrong-key", WRONG_KEY_AT)])
async def test_relay_reports_where_the_chain_broke(bad: str, hop: int) -> None:
    run = await run_on_sim(select(["H1"]), agents=2, behaviour=OracleBehaviour(oracle_book(), known_bad=bad))
    level = run.levels[0]
    assert [r.break_hop for a in level.agent_results for r in a.tests] == [hop, hop]
    assert [r.hops_completed for a in level.agent_results for r in a.tests] == [hop - 1, hop - 1]
    assert level.per_test[0].median_break_hop == hop
    assert level.pooled_pass_rate is None  # the relay is not part of the pooled T1–T17 figure


async def test_rescoring_a_saved_run_gives_the_same_scores(tmp_path: Path) -> None:
    # Half the replies known-bad, so the stored run has passes and failures to reproduce.
    tests = select(["T1", "T3", "T5", "T13", "T17"])
    run = await run_on_sim(tests, agents=4, behaviour=OracleBehaviour(oracle_book(), error_rate=0.5))
    level = run.levels[0]
    assert level.pooled_pass_rate is not None
    assert 0.0 < level.pooled_pass_rate < 1.0
    loaded = load_run(save_run(run, tmp_path))
    again = rescore(loaded)
    assert again.levels[0].per_test == level.per_test
    assert again.levels[0].pooled_pass_rate == level.pooled_pass_rate

    def verdicts(r: SuiteRun) -> list[tuple[str, str, Status, str]]:
        return [(a.agent_id, t.test_id, t.status, t.reason) for a in r.levels[0].agent_results for t in a.tests]

    assert verdicts(again) == verdicts(run)


async def test_rescore_applies_the_current_scorers(tmp_path: Path) -> None:
    run = await run_on_sim(select(["T1", "T2"]), agents=2)
    assert run.levels[0].pooled_pass_rate == 1.0
    stricter: Mapping[str, SuiteTest] = {
        **by_id(),
        "T1": dataclasses.replace(by_id()["T1"], score=lambda t: failed("stricter rule")),
    }
    again = rescore(load_run(save_run(run, tmp_path)), stricter)
    assert [s.pass_rate for s in again.levels[0].per_test] == [0.0, 1.0]
    assert again.levels[0].pooled_pass_rate == 0.5
    assert {t.reason for a in again.levels[0].agent_results for t in a.tests if t.test_id == "T1"} == {"stricter rule"}


async def test_failed_requests_leave_tests_unscored_not_failed() -> None:
    run = await run_on_sim(select(["T1", "T2"]), agents=2, faults=[parse_fault("http500:1")])
    level = run.levels[0]
    assert (level.completed, level.unscored, level.failed) == (0, 2, 0)
    assert all(s.unscored == 2 and s.failed == 0 for s in level.per_test)
    assert level.pooled_pass_rate is None  # nothing was judged: no rate, not 0 %
    assert (level.pooled_scored, level.pooled_unscored, level.pooled_not_run) == (0, 4, 0)
    assert level.seed_pooled_pass_rate == 0.0
    assert level.requests_failed == level.requests == 4
    # A 500 is the server's trouble, not a refusal of what was asked: no hint about the test is added.
    reasons = {r.reason for a in level.agent_results for r in a.tests}
    assert all(r.startswith("request failed (http_error") for r in reasons)
    assert not any("refused" in r for r in reasons)


@pytest.mark.parametrize(("payload_tokens", "size"), [(1_000, "~1,910 characters"), (8_000, "~15k characters")])
async def test_the_oracle_plays_t11_at_any_payload_size_for_every_agent(payload_tokens: int, size: str) -> None:
    # The oracle knows T11 by how it opens, not by its payload: any size the run chooses is played, and read.
    run = await run_on_sim(select(["T11", "H1"], payload_tokens=payload_tokens), agents=3)
    level = run.levels[0]
    assert [(s.test_id, s.passed) for s in level.per_test] == [("T11", 3), ("H1", 3)]
    assert size in level.per_test[0].title


async def test_a_t11_payload_the_server_refuses_is_unscored_and_says_why() -> None:
    # The laptop profile's context is 16,384 tokens; the default payload's request is ~30,000: refused with a 400.
    run = await run_on_sim(select(["T1", "T11"]), profile="laptop")
    level = run.levels[0]
    t1, t11 = level.agent_results[0].tests
    assert t1.status is Status.PASS
    assert t11.status is Status.UNSCORED
    assert "maximum context length is 16384 tokens" in t11.reason  # the server's own words
    assert "the server refused it (HTTP 400): T11's payload, ~57k characters" in t11.reason
    assert "lower --payload-tokens" in t11.reason
    assert (level.per_test[1].unscored, level.per_test[1].failed) == (1, 0)
    assert level.per_test[1].unscored_reasons == [t11.reason]
    assert level.pooled_pass_rate == 1.0  # T1 alone was judged


async def test_with_faults_and_retries_every_test_still_passes_and_no_transcript_is_lost() -> None:
    faults = [
        parse_fault(f) for f in ("reset:0.03", "http503:0.03", "http429:0.03:0.05", "malformed:0.03", "stall:0.03:3")
    ]
    tests = select(skip_hop=True)
    async with running_sim(behaviour=OracleBehaviour(oracle_book()), faults=faults, seed=7) as (server, url):
        # Deadlines shorter than the 3 s stall turn it into a retry instead of a long wait. The first-token one
        # matters too: a stall before the first token otherwise rides out the 600 s default and, in the
        # simulator, loses the tokens generated meanwhile (reported to the lead; sim/server.py's stall path).
        client = ChatClient(url, api_key_env=None, policy=FixedDeadlines(first_token_s=2.0, idle_s=0.5))
        backend = RetryingBackend(client, max_attempts=8, base_backoff_s=0.05, max_backoff_s=0.2)
        try:
            run = await run_suite(backend, tests, SuiteConfig(model=server.model_name), [8], RealClock())
        finally:
            await client.aclose()
    level = run.levels[0]
    assert level.pooled_pass_rate == 1.0
    assert (level.completed, level.unscored, level.failed) == (8, 0, 0)
    for agent in level.agent_results:
        assert [t.test_id for t in agent.tests] == [t.id for t in tests]
    retried = [t for a in level.agent_results for r in a.tests for t in r.transcript.turns if len(t.records) > 1]
    assert retried, "the faults must have hit some turns for this test to mean anything"
    assert level.requests_failed == sum(len(t.records) - 1 for t in retried)


class _CrashOn:
    """A backend that raises (a harness bug, say) on one test's first request."""

    def __init__(self, inner: SingleAttemptBackend, test_id: str, agent: str) -> None:
        self.inner, self.test_id, self.agent = inner, test_id, agent

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        if ids.agent == f"{self.agent}/{self.test_id}":
            raise RuntimeError("backend exploded")
        return await self.inner.complete(body, ids)


async def test_an_agent_that_crashes_is_failed_and_the_others_carry_on() -> None:
    async with running_sim(behaviour=OracleBehaviour(oracle_book())) as (server, url):
        client = ChatClient(url, api_key_env=None)
        backend = _CrashOn(SingleAttemptBackend(client), "T2", "agent-1")
        try:
            run = await run_suite(
                backend, select(["T1", "T2", "T3"]), SuiteConfig(model=server.model_name), [3], RealClock()
            )
        finally:
            await client.aclose()
    level = run.levels[0]
    status = {a.agent_id: a.status for a in level.agent_results}
    assert status == {"agent-0": AgentStatus.COMPLETED, "agent-1": AgentStatus.FAILED, "agent-2": AgentStatus.COMPLETED}
    crashed = next(a for a in level.agent_results if a.agent_id == "agent-1")
    assert crashed.error == "RuntimeError: backend exploded"
    assert [t.test_id for t in crashed.tests] == ["T1"]  # what it finished is kept
    assert [s.passed for s in level.per_test] == [3, 2, 2]


async def test_the_api_key_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOAD_SUITE_TEST_KEY", "sk-very-secret-4711")
    run = await run_on_sim(select(["T1"]), api_key_env="AGENTLOAD_SUITE_TEST_KEY")
    path = save_run(run, tmp_path)
    assert "sk-very-secret-4711" not in path.read_text(encoding="utf-8")
    assert run.levels[0].pooled_pass_rate == 1.0


class _Answers:
    """Answers every request after ``latency_s`` of the loop's clock with a plain reply (no tool calls)."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        clock = LoopClock()
        t = clock.now()
        await clock.sleep(self.latency_s)
        return [RequestRecord(ids=ids, t_sent=t, t_done=clock.now(), content="done")]


class _LostAt:
    def __init__(self, at_s: float) -> None:
        self.at_s = at_s

    async def wait_lost(self) -> str:
        await LoopClock().sleep(self.at_s)
        return "the server has not answered"


def test_a_lost_server_fails_every_session_keeping_the_tests_it_finished_in_order() -> None:
    # Each test is one 1 s turn; the server is lost at 2.5 s, in every agent's third test.
    async def go() -> SuiteRun:
        tests = select(["T1", "T2", "T3", "T5"])
        return await run_suite(_Answers(1.0), tests, SuiteConfig(model="m"), [2], LoopClock(), liveness=_LostAt(2.5))

    run = run_virtual(go())
    assert run.incomplete == "the server has not answered"
    (level,) = run.levels
    assert [a.agent_id for a in level.agent_results] == ["agent-0", "agent-1"]
    for agent in level.agent_results:
        assert agent.status is AgentStatus.FAILED
        assert agent.error == "stopped: the server was lost"
        assert [t.test_id for t in agent.tests] == ["T1", "T2"]  # the third, cut short, is not scored
        assert agent.session_s == pytest.approx(2.5)
