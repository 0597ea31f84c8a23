"""Suite results: immutable pydantic models that round-trip through a JSON file, with every transcript inside.

The runner accumulates per-agent results while it runs and calls ``compile_level`` once a load level is over;
reports render from the compiled (or re-loaded) result, never from live state. ``rescore`` re-judges stored
transcripts with the current scorers and recompiles the figures — nothing is re-run.

Figures per load level: pooled pass rate = passes / tests scored over T1–T17 (the H1 relay is reported on its
own, as the seed runner keeps its escalation out of the pooled figure), always beside the counts it rests on —
scored, unscored (a request failed: nothing to judge) and not run (the agent's session ended before it, e.g. the
server was lost). A test that was never judged is not a failure of the model, so it stays out of the rate. The
seed runner's figure, passes / (agents × tests), which counts those as failures, is kept as
``seed_pooled_pass_rate``. Then agents completed / unscored / failed; wall clock; median session time; sessions
per minute. Streaming adds what the seed's non-streaming requests could not give: time to first token, p50 / p95.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from agentload.agent.loop import Transcript
from agentload.errors import ConfigError
from agentload.suite.cases import by_id
from agentload.suite.model import SUITE_VERSION, Category, SuiteTest
from agentload.suite.scoring import Status, score


class TestResult(BaseModel):
    """One agent's run of one test: the verdict and the whole conversation it was judged on."""

    __test__ = False  # not a pytest class, whatever its name says
    model_config = ConfigDict(frozen=True)

    test_id: str
    category: Category
    status: Status
    reason: str
    break_hop: int | None = None
    hops_completed: int | None = None
    suite_version: str  # the suite whose scorer produced this verdict
    played_version: str  # the suite whose prompts and tools produced the transcript
    started_s: float  # seconds after the load level began
    duration_s: float
    transcript: Transcript

    @model_validator(mode="after")
    def _unscored_says_why(self) -> TestResult:
        # A test left unjudged is out of the pass rate; the report must be able to say why.
        if self.status is Status.UNSCORED and not self.reason.strip():
            raise ValueError(f"{self.test_id} is unscored without a reason")
        return self


class AgentStatus(StrEnum):
    COMPLETED = "completed"  # every test ran and was scored
    UNSCORED = "unscored"  # the session ran to the end but at least one test's request failed
    FAILED = "failed"  # the session stopped early (an error escaped the agent)


class AgentResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    agent_id: str
    status: AgentStatus
    error: str = ""
    session_s: float
    tests: list[TestResult]


class TestSummary(BaseModel):
    __test__ = False
    model_config = ConfigDict(frozen=True)

    test_id: str
    category: Category
    title: str
    passed: int
    failed: int
    unscored: int
    scored: int = 0  # passed + failed: the verdicts the rate rests on
    not_run: int = 0  # agents whose session ended before this test
    pass_rate: float | None  # passes / scored; None when no agent's run of it was judged
    seed_pass_rate: float = 0.0  # passes / agents, the seed runner's figure: unjudged and unrun count as failures
    unscored_reasons: list[str] = []  # why, distinct, first few
    median_break_hop: float | None = None  # H1 only, over the agents whose chain broke


class LevelResult(BaseModel):
    """One load level: N agents, each running the whole suite in order."""

    model_config = ConfigDict(frozen=True)

    agents: int
    suite_version: str
    tests: list[str]
    wall_clock_s: float
    per_test: list[TestSummary]
    pooled_tests: list[str]
    pooled_pass_rate: float | None  # passes / scored over pooled_tests; None when none was scored (or only H1 ran)
    pooled_scored: int = 0
    pooled_unscored: int = 0
    pooled_not_run: int = 0
    seed_pooled_pass_rate: float | None = None  # passes / (agents × pooled tests), the seed runner's figure
    completed: int
    unscored: int
    failed: int
    median_session_s: float | None
    sessions_per_min: float
    requests: int
    requests_failed: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    agent_results: list[AgentResult]


class SuiteRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    suite_version: str
    model: str
    endpoint: str  # the base URL, or "embedded simulator (profile)"; never a credential
    started_at: datetime
    payload_tokens: int
    levels: list[LevelResult]
    # Set (to why) when the run stopped early because the server was lost: the levels are those run until then,
    # the last one cut short, its stopped sessions failed with the tests they had finished.
    incomplete: str | None = None


@dataclass(frozen=True)
class TestInfo:
    """What a level's summary needs to know of a test (stored results carry it, so rescoring needs no more)."""

    __test__ = False

    id: str
    category: Category
    title: str

    @classmethod
    def of(cls, test: SuiteTest) -> TestInfo:
        return cls(test.id, test.category, test.title)


UNSCORED_REASONS_KEPT = 3  # a failing server gives every agent the same few reasons; the transcripts keep them all


def counts(level: LevelResult) -> str:
    """What the pooled rate rests on, to print beside it: "15 scored, 1 unscored, 1 not run"."""
    return f"{level.pooled_scored} scored, {level.pooled_unscored} unscored, {level.pooled_not_run} not run"


def cut_short(run: SuiteRun) -> str | None:
    """How far the run got when the server was lost ("server lost after 3 of 8 sessions at 8 agents"), or None
    for a run that was not cut short. A session is one agent's whole suite; the stopped ones did not finish."""
    if run.incomplete is None:
        return None
    if not run.levels:
        return "server lost before any level ran"
    last = run.levels[-1]
    finished = sum(a.status is not AgentStatus.FAILED for a in last.agent_results)
    return f"server lost after {finished} of {last.agents} sessions at {last.agents} agent{'s' * (last.agents != 1)}"


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def compile_level(
    agents: int, wall_clock_s: float, tests: Sequence[TestInfo], results: Iterable[AgentResult]
) -> LevelResult:
    """The level's figures from its agents' results (the one place they are computed)."""
    done = sorted(results, key=lambda a: a.agent_id)
    per_test: list[TestSummary] = []
    for test in tests:
        mine = [r for a in done for r in a.tests if r.test_id == test.id]
        n_pass = sum(r.status is Status.PASS for r in mine)
        n_fail = sum(r.status is Status.FAIL for r in mine)
        unscored = [r for r in mine if r.status is Status.UNSCORED]
        hops = [r.break_hop for r in mine if r.break_hop is not None]
        per_test.append(
            TestSummary(
                test_id=test.id,
                category=test.category,
                title=test.title,
                passed=n_pass,
                failed=n_fail,
                unscored=len(unscored),
                scored=n_pass + n_fail,
                not_run=max(agents - len(mine), 0),
                pass_rate=n_pass / (n_pass + n_fail) if n_pass + n_fail else None,
                seed_pass_rate=n_pass / agents if agents else 0.0,
                unscored_reasons=list(dict.fromkeys(r.reason for r in unscored))[:UNSCORED_REASONS_KEPT],
                median_break_hop=statistics.median(hops) if hops else None,
            )
        )
    pooled = [s for s in per_test if s.category is not Category.MULTIHOP]
    passes = sum(s.passed for s in pooled)
    scored = sum(s.scored for s in pooled)
    seed_rate = passes / (agents * len(pooled)) if pooled and agents else None
    finished = [a for a in done if a.status is not AgentStatus.FAILED]
    records = [rec for a in done for r in a.tests for rec in r.transcript.records()]
    ttfts = [x for rec in records if rec.ok and (x := rec.ttft) is not None]
    return LevelResult(
        agents=agents,
        suite_version=SUITE_VERSION,
        tests=[t.id for t in tests],
        wall_clock_s=wall_clock_s,
        per_test=per_test,
        pooled_tests=[s.test_id for s in pooled],
        pooled_pass_rate=passes / scored if scored else None,
        pooled_scored=scored,
        pooled_unscored=sum(s.unscored for s in pooled),
        pooled_not_run=sum(s.not_run for s in pooled),
        seed_pooled_pass_rate=seed_rate,
        completed=sum(a.status is AgentStatus.COMPLETED for a in done),
        unscored=sum(a.status is AgentStatus.UNSCORED for a in done),
        failed=sum(a.status is AgentStatus.FAILED for a in done),
        median_session_s=statistics.median(a.session_s for a in finished) if finished else None,
        # A session counts once it ran to its end, judged or not; one that crashed did not finish.
        sessions_per_min=len(finished) / (wall_clock_s / 60.0) if wall_clock_s > 0 else 0.0,
        requests=len(records),
        requests_failed=sum(not rec.ok for rec in records),
        ttft_p50_s=_percentile(ttfts, 50),
        ttft_p95_s=_percentile(ttfts, 95),
        agent_results=done,
    )


# A 4xx the server may answer any request with (it timed out, or is rate limiting): no fault of what was asked.
_NOT_A_REFUSAL = frozenset({408, 409, 425, 429})


def refused_status(transcript: Transcript) -> int | None:
    """The HTTP status of the request that ended a failed conversation, when the server refused that request as
    such (a 4xx other than a timeout or a rate limit: e.g. a 400 for a prompt longer than its context); else None."""
    if transcript.stop_reason != "failed" or not transcript.turns:
        return None
    status = transcript.turns[-1].final.http_status
    return status if status is not None and 400 <= status < 500 and status not in _NOT_A_REFUSAL else None


def unscored_reason(test: SuiteTest, transcript: Transcript, reason: str) -> str:
    """Why an unscored test could not be judged: the failed request, and for one the server refused (its status
    named) what in this test it most likely refused — T11's payload, for a server whose context is too short."""
    status = refused_status(transcript)
    if status is None:
        return reason
    hint = f": {test.refused_hint}" if test.refused_hint else ""
    return f"{reason}; the server refused it (HTTP {status}){hint}"


def judge(
    test: SuiteTest, transcript: Transcript, *, played_version: str, started_s: float, duration_s: float
) -> TestResult:
    """Score a finished conversation and keep it whole with the verdict."""
    status, verdict = score(test, transcript)
    reason = unscored_reason(test, transcript, verdict.reason) if status is Status.UNSCORED else verdict.reason
    return TestResult(
        test_id=test.id,
        category=test.category,
        status=status,
        reason=reason,
        break_hop=verdict.break_hop,
        hops_completed=verdict.hops_completed,
        suite_version=SUITE_VERSION,
        played_version=played_version,
        started_s=started_s,
        duration_s=duration_s,
        transcript=transcript,
    )


def _rescore_one(old: TestResult, tests: Mapping[str, SuiteTest]) -> TestResult:
    test = tests.get(old.test_id)
    if test is None:
        return old.model_copy(
            update={
                "status": Status.UNSCORED,
                "reason": f"suite {SUITE_VERSION} has no test {old.test_id}",
                "suite_version": SUITE_VERSION,
                "break_hop": None,
                "hops_completed": None,
            }
        )
    return judge(
        test, old.transcript, played_version=old.played_version, started_s=old.started_s, duration_s=old.duration_s
    )


def rescore(run: SuiteRun, tests: Mapping[str, SuiteTest] | None = None) -> SuiteRun:
    """Re-judge every stored transcript with the current scorers and recompile every level's figures."""
    table = dict(tests) if tests is not None else by_id(run.payload_tokens)
    levels: list[LevelResult] = []
    for level in run.levels:
        agents = [
            a.model_copy(update={"tests": [_rescore_one(r, table) for r in a.tests]}) for a in level.agent_results
        ]
        # The level's own test list and order: a test the current suite lacks is still reported (unscored).
        infos = [TestInfo(s.test_id, s.category, s.title) for s in level.per_test]
        levels.append(compile_level(level.agents, level.wall_clock_s, infos, agents))
    return run.model_copy(update={"levels": levels, "suite_version": SUITE_VERSION})


def refigure(run: SuiteRun) -> SuiteRun:
    """Every level's figures compiled again from its stored verdicts (nothing re-scored): a result saved before
    a figure existed, or while it was defined another way, reads as one saved now."""
    levels = []
    for level in run.levels:
        infos = [TestInfo(s.test_id, s.category, s.title) for s in level.per_test]
        again = compile_level(level.agents, level.wall_clock_s, infos, level.agent_results)
        levels.append(again.model_copy(update={"suite_version": level.suite_version}))
    return run.model_copy(update={"levels": levels})


def load_run(path: Path) -> SuiteRun:
    try:
        return refigure(SuiteRun.model_validate_json(path.read_bytes()))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f"{path} is not a suite result: {exc.errors()[0]['msg']}") from exc
