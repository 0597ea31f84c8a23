"""The knee on a real vLLM: found by ``bench --find-knee``, explained, and compared with the planner — on both tier
models, the kind one (one token per agentload word, replies run to max_tokens) and the realistic one (1.46 tokens
per word, replies that stop after a few tokens unless told ``ignore_eos``; issue 9).

The session servers' pool is 192 blocks of 128 tokens (24,576 tokens); agents holding 4,096 server tokens each need
32 blocks, so the pool holds 6 of them. Below that every agent's prefix stays cached between turns and a turn
prefills only its new tokens; past it the blocks of an agent in its tool/think pause are evicted before its next
turn (LRU over more working sets than fit), every turn recomputes its whole context, and the two cores' prefill
caps the turn rate. The search doubles 1, 2, 4, 8 and bisects 5..7.

Each test runs for the tiny model, then the realistic one; both knee searches are session fixtures, so each runs
once (the calibration tests, which come first in name order, start them).
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from agentload.bench.results import RunResult
from agentload.cli.main import app
from agentload.endpoint.scrape import ServerProbe
from tests.integration.conftest import BLOCK_TOKENS, CONTEXT, FIGURES, MAX_MODEL_LEN, POOL_BLOCKS, TIER_DIR, VllmServer


@pytest.fixture(params=["tiny", "realistic"])
def model(request: pytest.FixtureRequest) -> tuple[str, RunResult, VllmServer]:
    """(label, the knee search's result, its server) for each tier model."""
    label: str = request.param
    if label == "tiny":
        return label, request.getfixturevalue("knee_run"), request.getfixturevalue("vllm")
    return label, request.getfixturevalue("knee_run_realistic"), request.getfixturevalue("vllm_realistic")


async def test_the_knee_is_where_the_pool_runs_out(model: tuple[str, RunResult, VllmServer]) -> None:
    """Measured knee vs pool ÷ the realised context, in whole blocks as vLLM counts them, with the server's pool."""
    label, run, server = model
    async with ServerProbe(server.url) as probe:
        pool = await probe.pool()
    assert pool.num_blocks == POOL_BLOCKS
    assert pool.block_size == BLOCK_TOKENS
    realised = run.capacity[0].context
    estimate = pool.num_blocks / math.ceil(realised / pool.block_size)
    knee = run.knee[0]
    FIGURES[f"knee vs pool ÷ realised context ({label})"] = f"{knee.agents} / {estimate:g} (context {realised})"
    assert abs(knee.agents - estimate) <= 1, FIGURES[f"knee ({label})"]


def test_bench_reports_the_servers_pool_and_measured_over_predicted(model: tuple[str, RunResult, VllmServer]) -> None:
    label, run, _ = model
    estimate = run.capacity[0]
    assert estimate.pool_tokens == POOL_BLOCKS * BLOCK_TOKENS
    assert estimate.block_size == BLOCK_TOKENS
    assert estimate.target_context == CONTEXT
    assert estimate.sessions == pytest.approx(POOL_BLOCKS / math.ceil(estimate.context / BLOCK_TOKENS))
    knee = run.knee[0]
    assert knee.measured_over_predicted is not None
    assert 0.85 <= knee.measured_over_predicted <= 1.15, FIGURES[f"knee ({label})"]


def test_the_context_is_held_in_the_servers_tokens(model: tuple[str, RunResult, VllmServer]) -> None:
    """Every level's mean server-counted prompt + reply is within ±5 % of --context, whatever the tokenizer."""
    label, run, _ = model
    for level in run.levels:
        assert level.context_mean is not None, level
        assert abs(level.context_mean / CONTEXT - 1) <= 0.05, (
            level.agents,
            level.context_mean,
            FIGURES[f"knee ({label})"],
        )


def test_replies_have_the_requested_length(model: tuple[str, RunResult, VllmServer]) -> None:
    """ignore_eos + min_tokens: the realised output is the workload's, not the model's early stop."""
    label, run, _ = model
    assert run.settings["exact_output"] is True
    for level in run.levels:
        assert level.output_ratio is not None, level
        assert level.output_ratio >= 0.95, (level.agents, level.output_ratio, FIGURES[f"knee ({label})"])
        assert not level.output_short


def test_the_knee_level_measured_enough_turns(model: tuple[str, RunResult, VllmServer]) -> None:
    """The window (300 s) only caps a level: the knee's own level reached its turn count. (The level past it may
    not: past the cliff a turn re-prefills its whole context, and the cap is what bounds the search's time.)"""
    label, run, _ = model
    knee = run.knee[0].agents
    level = next(lv for lv in run.levels if lv.agents == knee)
    assert level.min_turns == max(8 * knee, 30), level
    assert level.turns >= level.min_turns, (knee, level.turns, FIGURES[f"knee ({label})"])
    FIGURES[f"turns per level ({label})"] = ", ".join(
        f"{lv.agents}: {lv.turns}/{lv.min_turns}" for lv in sorted(run.levels, key=lambda lv: lv.agents)
    )


def test_the_knee_is_explained_by_eviction_or_preemption(model: tuple[str, RunResult, VllmServer]) -> None:
    label, run, _ = model
    knee = run.knee[0]
    assert knee.explanation.cause in ("cache_eviction", "preemption"), FIGURES[f"knee ({label})"]
    assert knee.decided_by, FIGURES[f"knee ({label})"]
    by_agents = {lv.agents: lv for lv in run.levels}
    at = by_agents[knee.agents]
    past = min((lv for lv in run.levels if lv.agents > knee.agents), key=lambda lv: lv.agents)
    assert at.prefix_hit_rate_server is not None
    assert past.prefix_hit_rate_server is not None
    # Past the knee the cached prefix is gone by the next turn: the server's own counters say so.
    assert past.prefix_hit_rate_server < at.prefix_hit_rate_server - 0.2, FIGURES[f"knee ({label})"]


def test_client_and_server_prefix_hit_rates_agree_at_every_level(model: tuple[str, RunResult, VllmServer]) -> None:
    """Usage's cached tokens and vLLM's prefix-cache counters give the same hit rate over a level's window.

    At every level, past the knee too: the window's edges are quiet (bench/gate.py), so both figures cover the
    same requests (vLLM counts a prompt when it is scheduled, usage arrives when it ends).
    """
    label, run, _ = model
    gaps = {lv.agents: abs((lv.prefix_hit_rate_server or 0) - (lv.prefix_hit_rate_usage or 0)) for lv in run.levels}
    FIGURES[f"usage vs server hit rate per level ({label})"] = ", ".join(
        f"{a}: {g:.4f}" for a, g in sorted(gaps.items())
    )
    for level in run.levels:
        assert level.throughput_source == "server"
        assert level.prefix_hit_rate_server is not None
        assert level.prefix_hit_rate_usage is not None
        assert abs(level.prefix_hit_rate_server - level.prefix_hit_rate_usage) <= 0.01, level


def test_the_planner_given_the_logged_pool_predicts_the_measured_knee(knee_run: RunResult, vllm: VllmServer) -> None:
    tokens, _ = vllm.startup_line()
    # The planner knows no CPU "GPU"; with --pool-tokens the pool is the logged one and the GPU only names a
    # block size (16) for its own block arithmetic, which for a dense model gives the same pool ÷ context.
    result = CliRunner().invoke(app, ["plan", "--model", str(TIER_DIR / "model" / "config.json"), "--gpu", "h100",
                                      "--max-model-len", str(MAX_MODEL_LEN), "-c", str(CONTEXT),
                                      "--pool-tokens", str(tokens), "--no-curve", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    agents = json.loads(result.output)["agents"]
    estimate = agents["window_aware_sessions"]
    knee = knee_run.knee[0]
    FIGURES["planner"] = (
        f"agentload plan --pool-tokens {tokens}: {estimate:.2f} agents at {CONTEXT} "
        f"(recommended {agents['recommended_agents']}); measured knee {knee.agents} "
        f"(ratio {knee.agents / estimate:.3f})"
    )
    assert 0.85 <= knee.agents / estimate <= 1.15, FIGURES["planner"]
