"""Agentic sessions on the simulator in virtual time: the shapes they are meant to have, measured from the records.

The published agent shape (docs/background.md §1): >94% of prompt tokens served from the prefix cache, 131:1 input to
output, ~43 turns, sessions opening near 12k tokens and growing toward the target; ``agentic-hold`` keeps every
turn near the target instead.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict

import pytest

from agentload.clock import run_virtual
from agentload.endpoint.records import RequestRecord
from agentload.errors import ConfigError
from agentload.sim.faults import parse_fault
from agentload.workload.agentic import (
    PUBLISHED_IO_RATIO,
    PUBLISHED_OUTPUT_TOKENS,
    PUBLISHED_TURNS,
    AgenticShape,
    AgenticWorkload,
)
from tests.test_workload_harness import LevelRun, hit_rate, run_level, run_level_async, sim_server

CONTEXT = 16_384
BLOCK = 16  # the simulator's KV block: cached counts are multiples of it


def conversations(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[r.ids.agent].append(r)
    return {k: sorted(v, key=lambda r: r.ids.turn) for k, v in out.items()}


def finished(run: LevelRun) -> list[list[RequestRecord]]:
    """Conversations that ended on their own (another session of the same agent followed), not at the level end."""
    convs = conversations(run.records)
    last: dict[str, int] = {}
    for name in convs:
        agent, session = name.split("/")
        last[agent] = max(last.get(agent, -1), int(session[1:]))
    return [v for k, v in convs.items() if int(k.split("/")[1][1:]) < last[k.split("/")[0]]]


@pytest.fixture(scope="module")
def grow() -> LevelRun:
    return run_level(AgenticWorkload("grow"), 3, context=CONTEXT, duration_s=400.0)


@pytest.fixture(scope="module")
def hold() -> LevelRun:
    return run_level(AgenticWorkload("hold"), 3, context=CONTEXT, duration_s=300.0)


def test_grow_sessions_reuse_their_prefix_like_published_agents(grow: LevelRun) -> None:
    assert grow.records
    assert all(r.ok for r in grow.records)
    later = [r for r in grow.records if r.ids.turn > 0]
    # Published: >94% (Codex) / >96% of prompt tokens from the prefix cache.
    assert hit_rate(later) > 0.95
    assert hit_rate(grow.records) > 0.94


def test_grow_sessions_keep_the_published_input_output_ratio(grow: LevelRun) -> None:
    ratio = sum(r.prompt_tokens for r in grow.records) / sum(r.completion_tokens for r in grow.records)
    assert PUBLISHED_IO_RATIO * 0.85 <= ratio <= PUBLISHED_IO_RATIO * 1.15, ratio


def test_grow_contexts_grow_each_turn_and_stay_under_the_target(grow: LevelRun) -> None:
    done = finished(grow)
    assert len(done) >= 6
    for conv in conversations(grow.records).values():
        for a, b in itertools.pairwise(conv):
            # Each prompt holds the last one, its reply and a tool result.
            assert b.prompt_tokens > a.prompt_tokens + a.completion_tokens
        assert all(r.prompt_tokens + r.completion_tokens <= CONTEXT for r in conv)
    for conv in done:
        # A session ends only when its next turn would not fit: it got close to the target.
        assert conv[-1].prompt_tokens + conv[-1].completion_tokens > 0.9 * CONTEXT
    turns = statistics.median(len(c) for c in done)
    assert PUBLISHED_TURNS - 8 <= turns <= PUBLISHED_TURNS + 8, turns


def test_grow_sessions_open_at_the_scaled_start_and_share_the_system_prompt(grow: LevelRun) -> None:
    shape = AgenticShape.published(CONTEXT)
    firsts = [c[0] for c in conversations(grow.records).values()]
    assert {r.prompt_tokens for r in firsts} == {shape.opening_tokens}
    assert 0.25 * CONTEXT <= shape.opening_tokens <= 0.35 * CONTEXT
    # A session's first turn finds at most the shared system prompt cached, never another session's prefix.
    assert max(r.cached_tokens or 0 for r in firsts) <= shape.system_tokens + BLOCK
    later_firsts = [r for r in firsts if not r.ids.agent.endswith("/s0")]
    assert later_firsts
    assert all((r.cached_tokens or 0) >= shape.system_tokens - BLOCK for r in later_firsts)


def test_every_finished_session_is_reported(grow: LevelRun) -> None:
    reported: dict[str, int] = defaultdict(int)
    for s in grow.sessions:
        assert s.ok
        reported[s.agent_id] += 1
    started: dict[str, int] = defaultdict(int)
    for name in conversations(grow.records):
        started[name.split("/")[0]] += 1
    # Each agent's last session was cut by the level's end: started once more than reported.
    assert {a: n - 1 for a, n in started.items()} == dict(reported)


def test_hold_sessions_stay_near_the_target(hold: LevelRun) -> None:
    assert hold.records
    assert all(r.ok for r in hold.records)
    for conv in conversations(hold.records).values():
        sizes = [r.prompt_tokens + r.completion_tokens for r in conv]
        assert max(sizes) <= CONTEXT
        assert min(sizes) >= 0.9 * CONTEXT
    assert hit_rate([r for r in hold.records if r.ids.turn > 0]) > 0.95
    assert {len(c) for c in finished(hold)} == {PUBLISHED_TURNS}


def test_same_seed_same_sizes_other_seed_other_sizes() -> None:
    def sizes(seed: int) -> list[tuple[int, int]]:
        run = run_level(AgenticWorkload("grow"), 1, context=8192, duration_s=60.0, seed=seed)
        return [(r.prompt_tokens, r.completion_tokens) for r in run.records]

    first = sizes(7)
    assert len(first) >= 10
    assert sizes(7) == first
    assert sizes(8) != first


def test_next_level_finds_only_the_system_prompt_cached() -> None:
    """Text is salted with the level: agent 0 of level 1 must not hit agent 0's session of level 0."""
    server = sim_server()
    workload = AgenticWorkload("grow")
    shape = AgenticShape.published(8192)

    async def both() -> list[LevelRun]:
        return [
            await run_level_async(server, workload, 2, context=8192, duration_s=30.0, level=level) for level in (0, 1)
        ]

    _, second = run_virtual(both())
    firsts = [c[0] for c in conversations(second.records).values()]
    assert firsts
    assert all(shape.system_tokens - BLOCK <= (r.cached_tokens or 0) <= shape.system_tokens + BLOCK for r in firsts)


def test_a_failed_turn_ends_the_session_and_the_agent_goes_on() -> None:
    server = sim_server(faults=[parse_fault("http503:0.02")])
    run = run_level(AgenticWorkload("grow"), 2, context=8192, duration_s=400.0, server=server)
    failed = [r for r in run.records if not r.ok]
    assert failed
    convs = conversations(run.records)
    for r in failed:
        assert convs[r.ids.agent][-1] is r  # nothing was sent in that conversation after the failure
    assert sum(not s.ok for s in run.sessions) == len(failed)
    assert sum(s.ok for s in run.sessions) >= 2


def test_published_figures_are_reproduced_where_they_were_measured() -> None:
    """Scaled to a ~104k-token session (12k opening, 43 turns, 131:1), the reply is the published ~444 tokens."""
    shape = AgenticShape.published(104_000)
    assert abs(shape.output.mean - PUBLISHED_OUTPUT_TOKENS) < 0.05 * PUBLISHED_OUTPUT_TOKENS
    assert shape.opening_tokens == pytest.approx(12_000, abs=10)


@pytest.mark.parametrize(
    ("growth", "options", "context", "message"),
    [
        ("grow", {"turns": 0}, 16_384, "turns must be positive"),
        ("grow", {}, 512, "at least 1024"),
        ("grow", {"io_ratio": 1.0}, 16_384, "ratio must exceed 1"),
        ("grow", {"start_tokens": 20_000}, 16_384, "below the context"),
        ("grow", {"turns": 4000}, 4096, "too small"),
        ("hold", {"output_tokens": 3000, "tool_result_tokens": 3000}, 4096, "no room"),
        ("grow", {"think_s": -1.0}, 16_384, "must not be negative"),
    ],
)
def test_bad_shapes_are_config_errors(growth: str, options: dict[str, float], context: int, message: str) -> None:
    workload = AgenticWorkload("grow" if growth == "grow" else "hold", shape_options=options)
    with pytest.raises(ConfigError, match=message):
        workload.agents(2, context=context, seed=0)


def test_unknown_option_is_a_config_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown agentic option tunrs; known: .*turns"):
        AgenticWorkload("grow", shape_options={"tunrs": 3})
