"""``agentic-coding`` against the published figures of real coding agents, drawn and on the simulator.

The published figures are written here as numbers, not imported from the workload, so a change to the workload's
constants cannot move the targets it is checked against: Claude Code sessions (median 43 turns, a median reply of
444 tokens, subagents in 44 % of sessions, > 96 % of prompt tokens from the prefix cache), Codex on SWE-bench Pro
(inter-turn delays 5.2 s at p50, 81.4 s at p99; 94.2 % prefix hits) and the per-step appends of the public TraceLab
trace of Claude Code and Codex (median ~710-800 tokens, p90 ~3.2-6.1k at prefixes past 64k). Sources:
docs/workloads.md.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.workload.base import AgentDriver, LoadContext
from agentload.workload.coding import COMPACT_INSTRUCTION, CodingShape, CodingWorkload, SessionDraws, SessionPlan
from agentload.workload.registry import get_workload, known_workloads
from tests.test_workload_harness import hit_rate, run_level

SAMPLES = 4000


# -- the distributions, sampled -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampled() -> dict[str, np.ndarray]:
    shape = CodingShape.published(40_960)
    plans = [SessionPlan.draw(shape, np.random.default_rng([7, i])) for i in range(SAMPLES)]
    draws = SessionDraws(shape, [7, 0, 0])
    replies = np.array([draws.reply() for _ in range(SAMPLES)])
    tools = np.array([draws.tool_result() for _ in range(SAMPLES)])
    return {
        "turns": np.array([p.turns for p in plans]),
        "spawns": np.array([p.subagents > 0 for p in plans]),
        "subagents": np.array([p.subagents for p in plans if p.subagents]),
        "reply": replies,
        "append": replies + tools,
        "delay": np.array([draws.delay_s() for _ in range(SAMPLES)]),
    }


def test_sampled_sessions_have_the_published_turns_and_subagent_share(sampled: dict[str, np.ndarray]) -> None:
    assert 43 * 0.9 <= np.median(sampled["turns"]) <= 43 * 1.1
    assert 0.44 - 0.03 <= sampled["spawns"].mean() <= 0.44 + 0.03
    assert set(sampled["subagents"]) <= {1, 2, 3, 4}
    # A spread, not a constant: sessions from a handful of turns to well past a hundred.
    assert np.percentile(sampled["turns"], 10) < 20
    assert np.percentile(sampled["turns"], 90) > 90


def test_sampled_replies_have_the_published_median_and_a_long_tail(sampled: dict[str, np.ndarray]) -> None:
    assert 444 * 0.95 <= np.median(sampled["reply"]) <= 444 * 1.05
    assert np.percentile(sampled["reply"], 95) > 3 * 444


def test_sampled_appends_match_published_per_step_appends(sampled: dict[str, np.ndarray]) -> None:
    # TraceLab, steps with a prefix past 64k: p50 710-796, p90 3.1k-6.1k new tokens a step.
    assert 650 <= np.median(sampled["append"]) <= 850
    assert 2_800 <= np.percentile(sampled["append"], 90) <= 6_500


def test_sampled_delays_match_the_published_quantiles(sampled: dict[str, np.ndarray]) -> None:
    assert 5.2 * 0.93 <= np.median(sampled["delay"]) <= 5.2 * 1.07
    assert 81.4 * 0.8 <= np.percentile(sampled["delay"], 99) <= 81.4 * 1.2


# -- on the simulator ---------------------------------------------------------------------------------------------


@dataclass
class _Tap:
    """Keeps every request body beside its final record (the harness keeps them in different orders)."""

    ctx: LoadContext
    pairs: list[tuple[Mapping[str, Any], RequestRecord]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ctx, name)

    @property
    def backend(self) -> _Tap:
        return self

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        out = await self.ctx.backend.complete(body, ids)
        self.pairs.append((body, out[-1]))
        return out


class _TapDriver:
    def __init__(self, inner: AgentDriver, pairs: list[tuple[Mapping[str, Any], RequestRecord]]) -> None:
        self.inner, self.pairs = inner, pairs
        self.agent_id = inner.agent_id

    async def run(self, ctx: LoadContext) -> None:
        await self.inner.run(_Tap(ctx, self.pairs))


@dataclass
class Tapped:
    inner: CodingWorkload = field(default_factory=CodingWorkload)
    name: str = "agentic-coding"
    pairs: list[tuple[Mapping[str, Any], RequestRecord]] = field(default_factory=list)

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        return [_TapDriver(d, self.pairs) for d in self.inner.agents(count, context=context, seed=seed)]


@dataclass(frozen=True)
class Turn:
    body: Mapping[str, Any]
    record: RequestRecord

    @property
    def compaction(self) -> bool:
        return bool(self.body["messages"][-1]["content"] == COMPACT_INSTRUCTION)


@dataclass(frozen=True)
class CodingRun:
    context: int
    turns: list[Turn]
    records: list[RequestRecord]

    def conversations(self) -> dict[str, list[Turn]]:
        out: dict[str, list[Turn]] = defaultdict(list)
        for t in self.turns:
            out[t.record.ids.agent].append(t)
        return {k: sorted(v, key=lambda t: t.record.ids.turn) for k, v in out.items()}

    def work(self) -> list[Turn]:
        return [t for t in self.turns if not t.compaction]


def coding_run(context: int, agents: int, duration_s: float, seed: int = 0) -> CodingRun:
    tapped = Tapped()
    run = run_level(tapped, agents, context=context, duration_s=duration_s, seed=seed)
    return CodingRun(context, [Turn(b, r) for b, r in tapped.pairs], run.records)


@pytest.fixture(scope="module")
def wide() -> CodingRun:
    return coding_run(32_768, 3, 1_500.0)


@pytest.fixture(scope="module")
def narrow() -> CodingRun:
    return coding_run(2_048, 3, 600.0)


def test_every_turn_succeeds_and_stays_within_the_context(wide: CodingRun, narrow: CodingRun) -> None:
    for run in (wide, narrow):
        assert len(run.turns) >= 150
        assert all(t.record.ok for t in run.turns)
        assert max(t.record.prompt_tokens + t.record.completion_tokens for t in run.turns) <= run.context


def test_reply_lengths_do_not_shrink_with_the_context(wide: CodingRun, narrow: CodingRun) -> None:
    asked = {run.context: [t.body["max_tokens"] for t in run.work()] for run in (wide, narrow)}
    made = {run.context: [t.record.completion_tokens for t in run.work()] for run in (wide, narrow)}
    for context in (2_048, 32_768):
        # Published: 444 a reply, at any window. The few hundred turns here leave a sampling spread of ~10 %.
        assert 444 * 0.8 <= statistics.median(asked[context]) <= 444 * 1.2, context
        assert 444 * 0.8 <= statistics.median(made[context]) <= 444 * 1.2, context
    assert statistics.median(asked[2_048]) >= 0.8 * statistics.median(asked[32_768])


def test_contexts_grow_then_compact_to_system_prompt_and_summary(wide: CodingRun) -> None:
    compactions = 0
    for conv in wide.conversations().values():
        for a, b in itertools.pairwise(conv):
            if b.compaction:
                # The whole context goes to be summarised: the last prompt, its reply and the instruction.
                assert b.record.prompt_tokens > a.record.prompt_tokens + a.record.completion_tokens
                compactions += 1
            elif a.compaction:
                # Then the session goes on from its system prompt and one message: the summary and a tool result.
                assert len(b.body["messages"]) == 2
                assert b.body["messages"][0] == conv[0].body["messages"][0]
                assert b.body["messages"][1]["content"].startswith(a.record.content)
                assert b.record.prompt_tokens < a.record.prompt_tokens
            else:
                assert b.record.prompt_tokens > a.record.prompt_tokens + a.record.completion_tokens
    assert compactions >= 3
    # Compaction happens near the target, not long before it.
    peak = max(t.record.prompt_tokens for t in wide.turns if t.compaction)
    assert peak > 0.75 * wide.context


def test_prefix_reuse_is_as_high_as_published(wide: CodingRun) -> None:
    # Published: > 96 % (Claude Code), 94.2 % (Codex).
    assert hit_rate(wide.records) >= 0.90


def test_inter_turn_delays_on_the_server_follow_the_published_median(wide: CodingRun) -> None:
    gaps = [
        b.record.t_sent - a.record.t_done
        for conv in wide.conversations().values()
        for a, b in itertools.pairwise(conv)
        if not a.compaction and not b.compaction and ".sub" not in a.record.ids.agent
    ]
    assert len(gaps) >= 100
    assert 5.2 * 0.75 <= statistics.median(gaps) <= 5.2 * 1.25


def test_subagents_run_beside_their_parent_which_waits_for_them(wide: CodingRun) -> None:
    convs = wide.conversations()
    children = {k for k in convs if ".sub" in k}
    assert children
    for child in children:
        agent, session = child.split(".sub")[0], child.split("/")[1]
        parent = convs[f"{agent}/{session}"]
        siblings = [convs[c] for c in children if c.startswith(f"{agent}.sub") and c.endswith(f"/{session}")]
        first = min(t.record.t_sent for s in siblings for t in s)
        last = max(t.record.t_done for s in siblings for t in s)
        before = [t for t in parent if t.record.t_done <= first]
        after = [t for t in parent if t.record.t_sent >= first]
        assert before, "a subagent starts from a turn of its parent"
        # The parent sends nothing while its subagents work, and goes on (if it does) after the last of them.
        assert all(t.record.t_sent >= last for t in after)
        # Subagents have their own shared system prompt, not the parent's.
        assert convs[child][0].body["messages"][0] != parent[0].body["messages"][0]


def test_the_same_seed_gives_the_same_sessions() -> None:
    def shape(run: CodingRun) -> list[tuple[str, int, int, int, int]]:
        return sorted(
            (t.record.ids.agent, t.record.ids.turn, t.record.prompt_tokens, t.record.completion_tokens,
             t.body["max_tokens"])
            for t in run.turns
        )  # fmt: skip

    first, again, other = (coding_run(8_192, 2, 300.0, seed=s) for s in (3, 3, 4))
    assert shape(first) == shape(again)
    assert shape(first) != shape(other)


# -- the registry ------------------------------------------------------------------------------------------------


def test_registry_builds_it_with_the_request_options() -> None:
    assert "agentic-coding" in known_workloads()
    wl = get_workload("agentic-coding", ignore_eos=True, turns=20)
    assert isinstance(wl, CodingWorkload)
    assert wl.name == "agentic-coding"
    assert wl.extra_body == {"ignore_eos": True}
    assert wl.shape(40_960).turns.median == 20


@pytest.mark.parametrize(
    ("options", "context", "message"),
    [
        ({"think_s": 1.0}, 40_960, "unknown agentic-coding option think_s"),
        ({"turns": "many"}, 40_960, "must be a number"),
        ({"turns": 0}, 40_960, "turns must be at least 1"),
        ({"delay_p50_s": 9.0, "delay_p99_s": 2.0}, 40_960, "p50 <= p99"),
        ({"subagent_share": 1.5}, 40_960, "subagent_share"),
        ({}, 512, "at least 1024"),
    ],
)
def test_bad_options_are_one_config_error(options: dict[str, Any], context: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_workload("agentic-coding", **options).agents(1, context=context, seed=0)
