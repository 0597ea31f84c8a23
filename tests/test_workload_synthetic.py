"""The matched synthetic arm: the agentic turns' sizes, with nothing for the prefix cache to reuse."""

from __future__ import annotations

import itertools

import pytest

from agentload.errors import ConfigError
from agentload.workload.agentic import AgenticShape, AgenticWorkload, SizeStreams, grow_turn_sizes
from agentload.workload.synthetic import SyntheticWorkload
from tests.test_workload_harness import LevelRun, hit_rate, run_level

CONTEXT = 16_384


@pytest.fixture(scope="module")
def synthetic() -> LevelRun:
    return run_level(SyntheticWorkload(), 3, context=CONTEXT, duration_s=80.0, seed=5)


def test_synthetic_prompts_never_hit_the_prefix_cache(synthetic: LevelRun) -> None:
    assert len(synthetic.records) > 100
    assert all(r.ok for r in synthetic.records)
    assert hit_rate(synthetic.records) < 0.001
    # Every request is its own one-turn conversation, reported as a session.
    assert len({r.ids.agent for r in synthetic.records}) == len(synthetic.records)
    assert len(synthetic.sessions) == len(synthetic.records)


def test_synthetic_sends_the_agentic_turn_sizes_with_the_same_seed() -> None:
    """Agent i's requests are the very turns agentic agent i sends with the same seed, in the same order."""
    agentic = run_level(AgenticWorkload("grow"), 2, context=8192, duration_s=120.0, seed=3)
    synthetic = run_level(SyntheticWorkload(), 2, context=8192, duration_s=40.0, seed=3)

    def sizes(run: LevelRun, agent: str) -> list[tuple[int, int]]:
        mine = sorted((r for r in run.records if r.ids.agent.startswith(f"{agent}/")), key=lambda r: r.t_sent)
        return [(r.prompt_tokens, r.completion_tokens) for r in mine]

    for agent in ("agent-0", "agent-1"):
        real, matched = sizes(agentic, agent), sizes(synthetic, agent)
        n = min(len(real), len(matched))
        assert n > 45  # more than one agentic session's worth
        assert matched[:n] == real[:n]


def test_synthetic_shapes_match_an_agentic_run() -> None:
    """The same distribution of prompt sizes as the agentic sessions, spanning opening to target."""
    shape = AgenticShape.published(CONTEXT)
    sizes = [p for p, _ in itertools.islice(grow_turn_sizes(shape, SizeStreams(shape, 0, 0)), 400)]
    assert min(sizes) == shape.opening_tokens
    assert max(sizes) > 0.9 * CONTEXT
    assert max(sizes) <= CONTEXT


def test_pacing_sleeps_the_agentic_pauses() -> None:
    fast = run_level(SyntheticWorkload(), 1, context=8192, duration_s=30.0)
    paced = run_level(SyntheticWorkload(pace=True), 1, context=8192, duration_s=30.0)
    # ~2.2 s of tool and think time per request against well under a second of serving.
    assert len(paced.records) < len(fast.records) / 2


def test_unknown_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown synthetic option nope"):
        SyntheticWorkload(shape_options={"nope": 1})
