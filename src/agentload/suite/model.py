"""What a behaviour-suite test is: a scenario, its mock tools, and a rule-based scorer over the transcript.

A test never talks to a server itself. The runner turns it into an ``AgentSpec`` (the test's system prompt and
user prompt, exactly: nothing is added for the simulator's sake, so a real model sees only the test), gives the
agent a fresh set of the test's tools (so stateful tools are per agent), and hands the finished ``Transcript`` to
``score``. Scorers are pure functions of the transcript — no tool state, no clock —
so a stored result can be re-scored later by a newer scorer (``results.rescore``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.tools import Tool

# Bump when a test's prompt, tools or scorer changes: scores from different versions are not comparable.
SUITE_VERSION = "1.2"  # 1.1: raw tool results, echoed requests and placeholder arguments fail; 1.2: no oracle tag


class Category(StrEnum):
    """The six categories of the seed suite (docs/background.md §2), in the order the suite runs them."""

    BASIC = "basic"
    PARALLEL = "parallel"
    STRESS = "stress"
    INSTRUCTION = "instruction"
    EDGE = "edge"
    MULTIHOP = "multihop"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Category.BASIC: "basic tool calling",
    Category.PARALLEL: "parallel tool calls",
    Category.STRESS: "stress inputs",
    Category.INSTRUCTION: "instruction adherence",
    Category.EDGE: "edge cases",
    Category.MULTIHOP: "multi-hop escalation",
}


@dataclass(frozen=True)
class Verdict:
    """A scorer's judgement; ``break_hop`` / ``hops_completed`` only for the multi-hop chain."""

    passed: bool
    reason: str
    break_hop: int | None = None
    hops_completed: int | None = None


def passed(reason: str) -> Verdict:
    return Verdict(True, reason)


def failed(reason: str) -> Verdict:
    return Verdict(False, reason)


Scorer = Callable[[Transcript], Verdict]
ToolFactory = Callable[[], list[Tool]]


@dataclass(frozen=True)
class SuiteTest:
    id: str
    category: Category
    title: str  # what the test checks, in one line
    system: str  # the system prompt, sent as it is
    user: str
    tools: ToolFactory  # called once per agent: stateful tools must not be shared
    score: Scorer
    max_rounds: int = 8
    # Most scorers judge a final answer, so hitting the round cap fails before they run; the multi-hop scorer
    # wants the transcript anyway, to find the hop where the chain broke.
    answer_required: bool = True
    # Added to the reason when the test goes unscored because the server refused one of its requests as such (a
    # 4xx other than a timeout or a rate limit): what in this test it most likely refused. Empty: nothing to add.
    refused_hint: str = ""

    def system_prompt(self) -> str:
        return self.system

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": self.user}]
