"""Run the suite: N agents at once, each running every selected test in order, as the seed runner does.

The seed started one process per agent, all at once, with non-streaming requests (docs/background.md §2). Here an agent
is a ``SuiteSession`` whose tests are conversations (``scored_test``: a ``ToolConversation`` with fresh tools, run
whole, then scored) that ``agent.loop.ConversationDriver`` runs on the one runner (``load.runner``), over a
shared ``ChatBackend`` (streaming, so time to first token is measured too); every agent starts together and runs
the tests one after another. Bench's suite workload (``workload/suite.py``) runs the same ``scored_test``, pass
after pass.
A sweep runs one load level after another, never overlapping, so each level's figures are its own.

What can go wrong with one agent is data: a failed request makes that test unscored and the agent moves on to
the next test; an error that escapes the agent loop ends that agent's session as failed. Neither stops the
level. A lost server (the connection's liveness rule) or cancelling the run (Ctrl-C) does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from agentload.agent.loop import (
    AgentSpec,
    ChatBackend,
    ConversationDriver,
    Ending,
    Step,
    Steps,
    ToolConversation,
    TurnLog,
    Whole,
)
from agentload.agent.tools import ToolRegistry
from agentload.clock import Clock
from agentload.errors import ConfigError
from agentload.load.runner import Liveness, run_load
from agentload.suite.cases.stress import PAYLOAD_TOKENS
from agentload.suite.model import SUITE_VERSION, SuiteTest
from agentload.suite.results import (
    AgentResult,
    AgentStatus,
    LevelResult,
    SuiteRun,
    TestInfo,
    TestResult,
    compile_level,
    judge,
)
from agentload.suite.scoring import Status

# The output cap ``agentload suite`` puts on each turn unless told otherwise. A turn of the suite is a tool call or
# a short answer (the simulator's oracle, which passes every test, never writes more than 86 tokens in one), so
# 1,024 leaves a reasoning model room to think and still ends a turn in which a weak model rambles: uncapped, one
# generated 8,106 tokens in a single turn, 325 s. The cap counts against the server's context as the prompt does
# (a server refuses prompt + cap past its max-model-len), so a short-context run lowers it or --payload-tokens.
# Library callers (``SuiteConfig``) still default to no cap.
DEFAULT_MAX_TOKENS = 1024

TestDone = Callable[[int, TestResult], None]  # (agents in the level, the finished test's result)
LevelStart = Callable[[int, int], None]  # (agents in the level, tests each agent runs)


@dataclass(frozen=True)
class SuiteConfig:
    model: str
    max_tokens: int | None = None  # per turn; None lets the server decide (reasoning models need room)
    temperature: float | None = None  # None: the server's default, as agents in the wild run
    payload_tokens: int = PAYLOAD_TOKENS

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("the suite needs a model name")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max tokens must be positive, got {self.max_tokens}")


def check_agent_counts(counts: Sequence[int]) -> list[int]:
    if not counts:
        raise ConfigError("no agent counts to run")
    bad = [n for n in counts if n <= 0]
    if bad:
        raise ConfigError(f"agent counts must be positive, got {', '.join(map(str, bad))}")
    return list(counts)


class LevelAccumulator:
    """Mutable state of one load level while it runs; ``compile`` turns it into the immutable result."""

    def __init__(self, agents: int, tests: Sequence[SuiteTest], started: float) -> None:
        self.agents = agents
        self.tests = [TestInfo.of(t) for t in tests]
        self.started = started
        self.sessions: list[AgentResult] = []
        self.tests_done = 0

    def test_done(self) -> None:
        self.tests_done += 1

    def session_done(self, result: AgentResult) -> None:
        self.sessions.append(result)

    def compile(self, ended: float) -> LevelResult:
        return compile_level(self.agents, ended - self.started, self.tests, self.sessions)


def scored_test(
    agent_id: str,
    test: SuiteTest,
    config: SuiteConfig,
    clock: Clock,
    *,
    run_id: str,
    level: int,
    started: float,
    interrupted: list[TestResult] | None = None,
) -> Generator[Step, Ending | None, TestResult]:
    """One test as an agent's steps: its conversation (fresh tools), run whole, then scored (``yield from`` it).

    ``started`` is the level's start on ``clock``: the result says how far into the level the test began. A test
    cancelled on its way (the level stopped: the server was lost) is judged on what it did — its turns, and the
    attempts of the turn in flight that had ended (a retrying backend's cancel carries them) — and put in
    ``interrupted`` before the cancel goes on, so no request it sent is lost from the transcript.
    """
    t0 = clock.now()
    spec = AgentSpec(
        agent_id=f"{agent_id}/{test.id}",
        model=config.model,
        messages=test.messages(),
        max_rounds=test.max_rounds,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
    )
    tools = ToolRegistry.of(test.tools())  # fresh per agent: the T17 list is this agent's own
    conversation = ToolConversation(spec, tools, clock, run_id=run_id, level=level)
    try:
        ending = yield Whole(conversation)
    except asyncio.CancelledError as cancel:
        turns = conversation.transcript.turns
        attempts = list(getattr(cancel, "attempts", ()))
        if attempts:
            turns.append(TurnLog(round=len(turns), records=attempts))
        if interrupted is not None and turns:  # a test that recorded no request has nothing to keep
            transcript = conversation.finish(Ending("failed", len(turns)))
            interrupted.append(TestResult(
                test_id=test.id, category=test.category, status=Status.UNSCORED,
                reason="stopped before it ended: the server was lost", suite_version=SUITE_VERSION,
                played_version=SUITE_VERSION, started_s=t0 - started, duration_s=clock.now() - t0,
                transcript=transcript))  # fmt: skip
        raise
    assert ending is not None  # the driver sends a conversation's ending back
    transcript = conversation.finish(ending)
    return judge(test, transcript, played_version=SUITE_VERSION, started_s=t0 - started, duration_s=clock.now() - t0)


@dataclass
class SuiteSession:
    """One agent of a suite level: every selected test in order, each a conversation ``ConversationDriver`` runs
    (``agent.loop``) on the one runner (``load.runner``); the finished session goes to the level's accumulator.

    A failed request leaves its test unscored and the agent goes on; an error out of a test (a harness bug) ends
    the session as failed; a cancel (the server was lost) ends it as failed with the tests it finished. Neither
    stops the other agents.
    """

    agent_id: str
    tests: Sequence[SuiteTest]
    on_test: TestDone | None = None

    def conversations(self, ctx: LevelContext) -> Steps:
        clock, acc = ctx.clock, ctx.acc
        start = clock.now()
        results: list[TestResult] = []
        error = ""
        try:
            for test in self.tests:
                result = yield from scored_test(self.agent_id, test, ctx.config, clock, run_id=ctx.run_id,
                                                level=acc.agents, started=acc.started,
                                                interrupted=results)  # fmt: skip
                results.append(result)
                acc.test_done()
                if self.on_test is not None:
                    self.on_test(acc.agents, result)
        except Exception as exc:  # one agent's crash is data about that agent, not a reason to stop the others
            error = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            # The level was stopped (the server was lost): the tests this agent finished are kept, as a failed session.
            acc.session_done(
                AgentResult(
                    agent_id=self.agent_id,
                    status=AgentStatus.FAILED,
                    error="stopped: the server was lost",
                    session_s=clock.now() - start,
                    tests=results,
                )
            )
            raise
        if error:
            status = AgentStatus.FAILED
        elif any(r.status is Status.UNSCORED for r in results):
            status = AgentStatus.UNSCORED
        else:
            status = AgentStatus.COMPLETED
        session = AgentResult(agent_id=self.agent_id, status=status, error=error, session_s=clock.now() - start,
                              tests=results)  # fmt: skip
        acc.session_done(session)


@dataclass(frozen=True)
class LevelContext:
    """What a suite level's sessions share: the server, the settings, the clock and the level's accumulator."""

    backend: ChatBackend
    config: SuiteConfig
    clock: Clock
    acc: LevelAccumulator
    run_id: str = ""

    def should_stop(self) -> bool:
        """Never: a level ends when its sessions do (or, cancelled, when the server is lost)."""
        return False


async def run_level(
    backend: ChatBackend,
    tests: Sequence[SuiteTest],
    agents: int,
    config: SuiteConfig,
    clock: Clock,
    *,
    run_id: str = "",
    on_test: TestDone | None = None,
    liveness: Liveness | None = None,
) -> tuple[LevelResult, str | None]:
    """``agents`` sessions started together; the level ends when the last one does, or when the server is lost.

    Returns the level and, when ``liveness`` said the server was lost, why (the sessions were stopped then, each
    keeping the tests it finished). An error escaping a session (a bug: they catch their own) is raised.
    """
    check_agent_counts([agents])
    acc = LevelAccumulator(agents, tests, clock.now())
    width = len(str(agents - 1))
    drivers = [ConversationDriver(SuiteSession(f"agent-{i:0{width}d}", tests, on_test)) for i in range(agents)]
    ctx = LevelContext(backend, config, clock, acc, run_id)
    outcome = await run_load(drivers, ctx, liveness=liveness, clock=clock)
    return acc.compile(clock.now()), outcome.lost


class RemoteLevels(Protocol):
    """Runs a level's sessions elsewhere (``suite.distributed.RaySuite``: over Ray actors)."""

    async def run_level(
        self, tests: Sequence[SuiteTest], agents: int, config: SuiteConfig, run_id: str, on_test: TestDone | None
    ) -> tuple[list[AgentResult], int, str | None]:
        """(the level's sessions, tests finished, why the server was lost or None)."""
        ...


async def run_suite(
    backend: ChatBackend,
    tests: Sequence[SuiteTest],
    config: SuiteConfig,
    agent_counts: Sequence[int],
    clock: Clock,
    *,
    endpoint: str = "",
    on_level: LevelStart | None = None,
    on_test: TestDone | None = None,
    liveness: Liveness | None = None,
    remote: RemoteLevels | None = None,
) -> SuiteRun:
    """One level per agent count, in the order given; a lost server ends the run, marked incomplete.

    ``remote``: the levels' sessions run there (``--executor ray``); ``backend`` and ``liveness`` are then unused.
    """
    counts = check_agent_counts(agent_counts)
    if not tests:
        raise ConfigError("no tests to run")
    started_at = datetime.now(UTC)
    run_id = f"suite-{started_at:%Y%m%d-%H%M%S}"
    levels: list[LevelResult] = []
    lost: str | None = None
    for n in counts:
        if on_level is not None:
            on_level(n, len(tests))
        if remote is None:
            level, lost = await run_level(backend, tests, n, config, clock, run_id=run_id, on_test=on_test,
                                          liveness=liveness)  # fmt: skip
        else:
            check_agent_counts([n])
            acc = LevelAccumulator(n, tests, clock.now())
            acc.sessions, acc.tests_done, lost = await remote.run_level(tests, n, config, run_id, on_test)
            level = acc.compile(clock.now())
        levels.append(level)
        if lost is not None:
            break
    return SuiteRun(
        suite_version=SUITE_VERSION,
        model=config.model,
        endpoint=endpoint,
        started_at=started_at,
        payload_tokens=config.payload_tokens,
        levels=levels,
        incomplete=lost,
    )
