"""The suite's tests, in the order every agent runs them: T1–T17 in five categories, then the H1 relay."""

from __future__ import annotations

from collections.abc import Sequence

from agentload.errors import ConfigError
from agentload.suite.cases import basic, edge, instruction, multihop, parallel, stress
from agentload.suite.model import Category, SuiteTest


def all_tests(payload_tokens: int = stress.PAYLOAD_TOKENS) -> list[SuiteTest]:
    if payload_tokens < 1000:
        raise ConfigError(f"the large payload must be at least 1000 tokens, got {payload_tokens}")
    return [
        *basic.TESTS,
        *parallel.TESTS,
        *stress.with_payload(payload_tokens),
        *instruction.TESTS,
        *edge.TESTS,
        *multihop.TESTS,
    ]


def select(
    ids: Sequence[str] | None = None, *, skip_hop: bool = False, payload_tokens: int = stress.PAYLOAD_TOKENS
) -> list[SuiteTest]:
    """The tests to run, in suite order; ``ids`` are matched case-insensitively, an unknown one is an error."""
    tests = all_tests(payload_tokens)
    if ids:
        by_id = {t.id.upper(): t for t in tests}
        unknown = [i for i in ids if i.strip().upper() not in by_id]
        if unknown:
            raise ConfigError(f"unknown test id {', '.join(unknown)}; known: {', '.join(t.id for t in tests)}")
        wanted = {i.strip().upper() for i in ids}
        tests = [t for t in tests if t.id.upper() in wanted]
    if skip_hop:
        tests = [t for t in tests if t.category is not Category.MULTIHOP]
    if not tests:
        raise ConfigError("no tests left to run (--skip-hop removed the only one selected)")
    return tests


def by_id(payload_tokens: int = stress.PAYLOAD_TOKENS) -> dict[str, SuiteTest]:
    return {t.id: t for t in all_tests(payload_tokens)}
