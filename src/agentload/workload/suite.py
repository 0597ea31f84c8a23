"""The behaviour suite as a load (issue 4, item 1): pass rate under load, not just throughput.

Each agent runs the suite (``agentload.suite``: T1–T17 and the H1 relay, rule-scored) test after test through the
level's backend, pass after pass until the level ends, and reports every pass through ``ctx.session_done`` with
``passed`` and ``scored`` counted as the suite's pooled pass rate counts them (domain.md §2, suite/results.py):
over T1–T17, the H1 relay kept out; a test whose request failed (unscored) counts against, as a test the seed's
agents never finished did. The bench's pass rate is then Σ passed ÷ Σ scored over the level.

Tests go one at a time through the suite runner's ``run_session``, so the end of the level is noticed between
tests rather than after a whole pass (the relay alone is 51 turns). A pass the level's end cuts short is still
reported with the tests it finished — under a short level, those are the only scores there are. The suite runner
stamps a request's level with its agent count; the backend here restamps the bench's level, so records group
by level like every other workload's. Passes are named ``<agent>/p<n>`` (a test's conversation then is
``<agent>/p<n>/<test>``), so a recorded run keeps each pass's conversations apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentload.agent.loop import ChatBackend, pause
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.suite.cases import select
from agentload.suite.cases.stress import PAYLOAD_TOKENS
from agentload.suite.model import Category, SuiteTest
from agentload.suite.results import AgentStatus
from agentload.suite.runner import LevelAccumulator, SuiteConfig, run_session
from agentload.suite.scoring import Status
from agentload.workload.agentic import FAILURE_PAUSE_S, agent_ids
from agentload.workload.base import AgentDriver, LoadContext


class _AtLevel:
    """The level's backend with every request stamped with the bench's level."""

    def __init__(self, inner: ChatBackend, level: int) -> None:
        self._inner = inner
        self._level = level

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        return await self._inner.complete(body, ids.model_copy(update={"level": self._level}))


@dataclass
class SuiteDriver:
    agent_id: str
    tests: Sequence[SuiteTest]
    max_tokens: int | None = None
    temperature: float | None = None
    payload_tokens: int = PAYLOAD_TOKENS
    passes: int = 0

    async def run(self, ctx: LoadContext) -> None:
        config = SuiteConfig(
            model=ctx.model,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            payload_tokens=self.payload_tokens,
        )
        backend = _AtLevel(ctx.backend, ctx.level)
        while not ctx.should_stop():
            name = f"{self.agent_id}/p{self.passes}"
            self.passes += 1
            passed = scored = 0
            ok = True
            for i, test in enumerate(self.tests):
                if i > 0 and ctx.should_stop():
                    break
                # A fresh accumulator per test: the runner keeps whole transcripts in it, which a long level
                # would otherwise pile up.
                acc = LevelAccumulator(1, [test], ctx.clock.now())
                result = await run_session(name, [test], backend, config, ctx.clock, acc, run_id=ctx.run_id)
                if result.status is AgentStatus.FAILED:
                    ok = False
                    break
                pooled = [t for t in result.tests if t.category is not Category.MULTIHOP]
                passed += sum(1 for t in pooled if t.status is Status.PASS)
                scored += len(pooled)
                # An unscored test means a request failed; against a dead server that takes no time at all, so
                # wait a little rather than spin through the suite.
                if any(t.status is Status.UNSCORED for t in result.tests) and not await pause(
                    ctx.clock, FAILURE_PAUSE_S, ctx.should_stop
                ):
                    break
            ctx.session_done(self.agent_id, ok=ok, passed=passed, scored=scored)


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
            SuiteDriver(agent_id, self._selected, self.max_tokens, self.temperature, self.payload_tokens)
            for agent_id in agent_ids(count)
        ]
