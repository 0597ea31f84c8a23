"""What a behaviour-suite test is: a scenario, its mock tools, and a rule-based scorer over the transcript.

A test never talks to a server itself. The runner turns it into an ``AgentSpec`` (system prompt with the oracle
marker, user prompt), gives the agent a fresh set of the test's tools (so stateful tools are per agent), and hands
the finished ``Transcript`` to ``score``. Scorers are pure functions of the transcript — no tool state, no clock —
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
SUITE_VERSION = "1.1"  # 1.1: raw tool results, echoed requests and placeholder arguments fail


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


def marker(test_id: str) -> str:
    """The oracle marker (agentload.sim.behaviour.MARKER): the simulator answers as this test's scenario."""
    return f"[agentload:scenario={test_id}]"


@dataclass(frozen=True)
class SuiteTest:
    id: str
    category: Category
    title: str  # what the test checks, in one line
    system: str  # the system prompt without the marker
    user: str
    tools: ToolFactory  # called once per agent: stateful tools must not be shared
    score: Scorer
    max_rounds: int = 8
    # Most scorers judge a final answer, so hitting the round cap fails before they run; the multi-hop scorer
    # wants the transcript anyway, to find the hop where the chain broke.
    answer_required: bool = True

    def system_prompt(self) -> str:
        # The marker is a bracketed tag at the end: a real model reads it as noise, the simulator as its cue.
        return f"{self.system}\n\n{marker(self.id)}"

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": self.user}]
