"""The behaviour suite as a load: pass rate under load, not just throughput.

Each agent runs the suite (``agentload.suite``: T1–T17 and the H1 relay, rule-scored) test after test through the
level's backend, pass after pass until the level ends, and reports every pass through ``ctx.session_done`` with
``passed`` and ``scored`` counted as the suite's pooled pass rate counts them (docs/background.md §2, suite/results.py):
over T1–T17, the H1 relay kept out; a test whose request failed (unscored) counts against, as a test the seed's
agents never finished did. The bench's pass rate is then Σ passed ÷ Σ scored over the level.

Each test is the suite runner's ``scored_test`` — a tool-calling conversation yielded to
``agent.loop.ConversationDriver``, run whole, then scored — so the end of the level is noticed between tests
rather than after a whole pass (the relay alone is 51 turns), and the test in flight finishes. A pass the level's
end cuts short is still reported with the tests it finished — under a short level, those are the only scores
there are. Requests carry the bench's level, so records group by level like every other workload's. Passes are
named ``<agent>/p<n>`` (a test's conversation then is ``<agent>/p<n>/<test>``), so a recorded run keeps each
pass's conversations apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentload.agent.loop import ConversationDriver, Steps, Wait
from agentload.errors import ConfigError
from agentload.suite.cases import select
from agentload.suite.cases.stress import PAYLOAD_TOKENS
from agentload.suite.model import Category, SuiteTest
from agentload.suite.runner import SuiteConfig, scored_test
from agentload.suite.scoring import Status
from agentload.workload.agentic import FAILURE_PAUSE_S, agent_ids
from agentload.workload.base import AgentDriver, LoadContext


@dataclass
class _Tally:
    """One pass's score so far."""

    ok: bool = True
    passed: int = 0
    scored: int = 0


@dataclass
class SuiteAgent:
    """One agent running the suite pass after pass: each test a conversation (``suite.runner.scored_test``) that
    ``agent.loop.ConversationDriver`` runs whole; the score is kept here, between conversations."""

    agent_id: str
    tests: Sequence[SuiteTest]
    max_tokens: int | None = None
    temperature: float | None = None
    payload_tokens: int = PAYLOAD_TOKENS
    passes: int = 0

    def conversations(self, ctx: LoadContext) -> Steps:
        config = SuiteConfig(
            model=ctx.model,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            payload_tokens=self.payload_tokens,
        )
        while not ctx.should_stop():
            name = f"{self.agent_id}/p{self.passes}"
            self.passes += 1
            tally = _Tally()
            try:
                yield from self._one_pass(name, config, ctx, tally)
            except GeneratorExit:  # the level's stop cut the failure pause short: the pass ends with what it has
                ctx.session_done(self.agent_id, ok=tally.ok, passed=tally.passed, scored=tally.scored)
                raise
            ctx.session_done(self.agent_id, ok=tally.ok, passed=tally.passed, scored=tally.scored)

    def _one_pass(self, name: str, config: SuiteConfig, ctx: LoadContext, tally: _Tally) -> Steps:
        for i, test in enumerate(self.tests):
            if i > 0 and ctx.should_stop():
                return
            try:
                result = yield from scored_test(name, test, config, ctx.clock, run_id=ctx.run_id, level=ctx.level,
                                                started=ctx.clock.now())  # fmt: skip
            except Exception:  # a harness bug in this test: the pass is failed, the level goes on
                tally.ok = False
                return
            if result.category is not Category.MULTIHOP:
                tally.passed += result.status is Status.PASS
                tally.scored += 1
            # An unscored test means a request failed; against a dead server that takes no time at all, so wait a
            # little rather than spin through the suite.
            if result.status is Status.UNSCORED:
                yield Wait(pause_s=FAILURE_PAUSE_S)


SUITE_OPTIONS = ("tests", "skip_hop", "payload_tokens", "max_tokens", "temperature")


@dataclass
class SuiteWorkload:
    """``suite``: every agent runs the behaviour suite, pass after pass; options select tests and sizes."""

    tests: Sequence[str] | str | None = None  # test ids (or "T1,T5"); all of them by default
    skip_hop: bool = False
    payload_tokens: int = PAYLOAD_TOKENS
    max_tokens: int | None = None
    temperature: float | None = None
    name: str = "suite"
    _selected: list[SuiteTest] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ids = self.tests.split(",") if isinstance(self.tests, str) else self.tests
        self._selected = select(ids, skip_hop=self.skip_hop, payload_tokens=self.payload_tokens)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max tokens must be positive, got {self.max_tokens}")

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # ``context`` and ``seed`` do not apply: the suite's tests fix their conversations.
        return [
            ConversationDriver(
                SuiteAgent(agent_id, self._selected, self.max_tokens, self.temperature, self.payload_tokens)
            )
            for agent_id in agent_ids(count)
        ]
