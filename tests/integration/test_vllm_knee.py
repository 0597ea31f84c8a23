"""The knee on a real vLLM, and what bench counts there, on both tier models.

Both models get the whole knee search: the tiny one (one token per agentload word, replies run to max_tokens and
come back as the same tokens) and the realistic one (1.46 tokens per word, replies that stop after a few tokens
unless told ``ignore_eos`` and that re-tokenise longer when sent back) — so context, output, both hit rates and the
knee are checked on a model agentload was not tuned to, not only on a kind one.

The session servers' pool is 192 blocks of 128 tokens (24,576 tokens); agents holding 4,096 server tokens each need
32 blocks, so pool ÷ context is 6 of them (6.5 with the shared system prompt stored once). Past the knee the blocks
of an agent in its tool/think pause are evicted before its next turn and every turn recomputes its whole context.
On a slower CPU (no AVX-512) the turn rate saturates on compute near 3-4 agents, before the pool
(``compute_bound``): the tests then check what the tool said instead — a compute knee with the cache intact, step
time growing past it, and the prefixes lost where the search went past the pool.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from agentload.bench.results import RunResult
from agentload.cli.main import app
from agentload.endpoint.scrape import ServerProbe
from tests.integration.vllm import (
    BLOCK_TOKENS,
    CONTEXT,
    FIGURES,
    MAX_MODEL_LEN,
    MODELS,
    POOL_BLOCKS,
    TIER_DIR,
    VllmServer,
    compute_bound,
    pool_cliff_levels,
    pool_knee_range,
)


@pytest.fixture(params=list(MODELS))
def model(request: pytest.FixtureRequest) -> tuple[str, RunResult]:
    """(label, the knee search on that model's server)."""
    label: str = request.param
    return label, request.getfixturevalue(MODELS[label][0])


@pytest.fixture
def server(model: tuple[str, RunResult], request: pytest.FixtureRequest) -> VllmServer:
    """The server ``model``'s knee search ran against."""
    found: VllmServer = request.getfixturevalue(MODELS[model[0]][1])
    return found


def why(label: str) -> str:
    return FIGURES.get(f"knee ({label})", "")


# -- what bench counts, on both models -------------------------------------------------------------------------
def test_the_context_is_held_in_the_servers_tokens(model: tuple[str, RunResult]) -> None:
    """Every level's mean server-counted prompt + reply is within ±5 % of --context, whatever the tokenizer."""
    label, run = model
    for level in run.levels:
        assert level.context_mean is not None, level
        assert abs(level.context_mean / CONTEXT - 1) <= 0.05, (level.agents, level.context_mean, why(label))
    tokens_per_word = run.settings["tokens_per_word"]
    assert isinstance(tokens_per_word, float)
    FIGURES[f"tokens per word ({label})"] = f"{tokens_per_word:.3f}"
    assert tokens_per_word >= (1.3 if label == "realistic" else 0.9), run.settings


def test_replies_have_the_requested_length(model: tuple[str, RunResult]) -> None:
    """ignore_eos + min_tokens: the realised output is the workload's, not the model's early stop."""
    label, run = model
    assert run.settings["exact_output"] is True
    # What the turns asked against what the workload drew (a held session shortens a long draw to stay at its
    # context), printed: a level that asked under 95 % of its draws is flagged and its tok/s not compared.
    FIGURES[f"output asked ÷ drawn per level ({label})"] = ", ".join(
        f"{lv.agents}: {lv.output_requested_mean or 0:.1f} / {lv.output_drawn_mean or 0:.1f}"
        + (" (flagged)" if lv.output_clamped else "")
        for lv in run.levels
    )
    for level in run.levels:
        assert level.output_ratio is not None, level
        assert level.output_ratio >= 0.95, (level.agents, level.output_ratio, why(label))
        assert not level.output_short
        assert level.output_drawn_mean is not None, level


# A level past the cliff on a slow CPU can end its window with a few turns (seen: 5 of 64 on an AVX2-only machine),
# where one turn's admission and its usage landing either side of an edge is a share of the whole.
MIN_COMPARED_TURNS = 10
# What bench writes on a level whose window edge could not wait for every request in flight (bench/runner.py).
NOT_QUIET = "still in flight after"


def test_client_and_server_prefix_hit_rates_agree_at_every_level(model: tuple[str, RunResult]) -> None:
    """Usage's cached tokens and vLLM's prefix-cache counters give the same hit rate over a level's window.

    The window's edges are quiet (``endpoint.backend.QuiesceGate``), so both figures cover the same requests (vLLM
    counts a prompt when it is admitted, usage arrives when it ends). Within 1 % up to the knee. Past it they can part
    by a little more:
    measured gaps past the knee are 0.0000–0.0201 on the tiny model and 0.0128–0.0137 at 8 agents on the
    realistic one, with no preemption at those levels, and the cause is not yet understood (a re-admission after
    a preemption cannot explain it: vLLM 0.32 counts those in its separate ``preempted_*`` stats, and usage's
    ``cached_tokens`` then comes from the admission that finished the prefill — so each preempted turn is allowed
    on top). Gated at 3 % + preemptions ÷ turns past the knee; the goal is 1 % at every level, and the figures
    are printed.
    """
    label, run = model
    gaps = {lv.agents: abs((lv.prefix_hit_rate_server or 0) - (lv.prefix_hit_rate_usage or 0)) for lv in run.levels}
    FIGURES[f"usage vs server hit rate per level ({label})"] = (
        ", ".join(f"{a}: {g:.4f}" for a, g in sorted(gaps.items()))
        + " (preemptions ÷ turns: "
        + ", ".join(f"{lv.agents}: {(lv.preemptions or 0):.0f}/{lv.turns}" for lv in run.levels)
        + ")"
    )
    knee = run.knee[0].agents if run.knee else min(lv.agents for lv in run.levels)
    for level in run.levels:
        if level.turns < MIN_COMPARED_TURNS:  # a handful of turns past a slow machine's cliff: printed, not judged
            continue
        if level.agents > knee and any(NOT_QUIET in w for w in level.warnings):
            # Past a slow machine's cliff a turn can take minutes (seen: 4 requests still in flight 120 s after an
            # edge closed, 6 agents on an AVX2-only CPU): the counters were sampled with them in flight, so the two
            # rates cover different requests, and bench says so on the level. Printed, not judged.
            continue
        assert level.throughput_source == "server"
        assert level.prefix_hit_rate_server is not None
        assert level.prefix_hit_rate_usage is not None
        preempted_share = (level.preemptions or 0) / max(level.turns, 1)
        limit = 0.01 if level.agents <= knee else 0.03 + preempted_share
        assert abs(level.prefix_hit_rate_server - level.prefix_hit_rate_usage) <= limit, level


# -- the knee, on both models -------------------------------------------------------------------------------------
async def test_the_knee_is_where_the_pool_runs_out(model: tuple[str, RunResult], server: VllmServer) -> None:
    """Measured knee vs pool ÷ the realised context, in whole blocks as vLLM counts them, with the server's pool.

    The goal is ±1 agent; what is gated is the knee between 0.85× and 2× the estimate (see the module
    docstring: compute saturation on two CPU cores smears the cliff). The figure is printed either way.
    """
    label, knee_run = model
    async with ServerProbe(server.url) as probe:
        pool = await probe.pool()
    assert pool.num_blocks == POOL_BLOCKS
    assert pool.block_size == BLOCK_TOKENS
    realised = knee_run.capacity[0].context
    estimate = pool.num_blocks / math.ceil(realised / pool.block_size)
    knee = knee_run.knee[0]
    FIGURES[f"knee vs pool ÷ realised context ({label})"] = f"{knee.agents} / {estimate:g} (context {realised})"
    if reason := compute_bound(knee_run):
        # Compute gave out first; the pool is still where the arithmetic puts it if every level the search measured
        # more than one agent past pool ÷ context lost its prefixes (misses at least doubled against the knee's).
        beyond = pool_cliff_levels(knee_run)
        if not beyond:
            pytest.skip(f"{reason}; the search measured no level past the pool")
        by_agents = {lv.agents: lv for lv in knee_run.levels}
        at_hits = by_agents[knee.agents].prefix_hit_rate_server
        assert at_hits is not None
        for n in beyond:
            hits = by_agents[n].prefix_hit_rate_server
            assert hits is not None
            assert 1 - hits >= 2 * (1 - at_hits), (n, reason, why(label))
        return
    low, high = pool_knee_range(estimate)
    assert low <= knee.agents <= high, why(label)


def test_bench_reports_the_servers_pool_and_measured_over_predicted(model: tuple[str, RunResult]) -> None:
    label, knee_run = model
    estimate = knee_run.capacity[0]
    assert estimate.pool_tokens == POOL_BLOCKS * BLOCK_TOKENS
    assert estimate.block_size == BLOCK_TOKENS
    assert estimate.target_context == CONTEXT
    assert estimate.sessions == pytest.approx(POOL_BLOCKS / math.ceil(estimate.context / BLOCK_TOKENS))
    assert estimate.sessions is not None
    assert estimate.sessions_shared_prefix is not None
    assert estimate.sessions_shared_prefix > estimate.sessions
    knee = knee_run.knee[0]
    assert knee.measured_over_predicted is not None
    if reason := compute_bound(knee_run):
        pytest.skip(reason)
    # Or, below 0.85, within one agent of pool ÷ realised context (the ±1 goal; the prediction may be the
    # shared-prefix one, 6.5 where the pool holds 6).
    low_ok = knee.measured_over_predicted >= 0.85 or knee.agents >= estimate.sessions - 1
    assert low_ok, why(label)
    assert knee.measured_over_predicted <= 2.0, why(label)


def test_the_knee_level_measured_enough_turns(model: tuple[str, RunResult]) -> None:
    """The window only caps a level: the knee's own level reached its turn count. (The level past it may not:
    past the cliff a turn re-prefills its whole context, and the cap is what bounds the search's time.)"""
    label, knee_run = model
    knee = knee_run.knee[0].agents
    level = next(lv for lv in knee_run.levels if lv.agents == knee)
    FIGURES[f"turns per level ({label})"] = ", ".join(
        f"{lv.agents}: {lv.turns}/{lv.min_turns}" for lv in sorted(knee_run.levels, key=lambda lv: lv.agents)
    )
    assert level.min_turns == max(8 * knee, 30), level
    assert level.turns >= level.min_turns, (knee, level.turns, why(label))


def test_the_knee_is_explained_and_names_what_decided(model: tuple[str, RunResult]) -> None:
    label, knee_run = model
    knee = knee_run.knee[0]
    assert knee.explanation.cause != "none", why(label)
    assert knee.decided_by, why(label)
    assert "decided by" in knee.explanation.summary
    by_agents = {lv.agents: lv for lv in knee_run.levels}
    at = by_agents[knee.agents]
    past = by_agents[max(by_agents)]
    assert at.prefix_hit_rate_server is not None
    assert past.prefix_hit_rate_server is not None
    # The largest level the search tried is past the cliff: the server's own counters show prefixes lost. Judged
    # on the miss rate (it at least doubles — the knee rule's own test), since with a 120 s window the level ends
    # before the hit rate bottoms out and how far past the cliff the search goes depends on where compute gave
    # out (seen: 97.3 % at a knee of 8 → 81.3 % at 12; on a busier machine 97.3 % at 6 → 88.9 % at 8).
    at_misses, past_misses = 1 - at.prefix_hit_rate_server, 1 - past.prefix_hit_rate_server
    if compute_bound(knee_run):
        # A compute knee keeps the cache just past it; what names the cause is the step time the server took.
        evidence = knee.explanation.evidence
        assert evidence.get("itl_p50_s_past_knee", 0.0) > evidence.get("itl_p50_s_at_knee", float("inf")), why(label)
        return
    assert past_misses >= 2 * at_misses, why(label)


def test_the_planner_given_the_logged_pool_predicts_the_measured_knee(
    model: tuple[str, RunResult], server: VllmServer
) -> None:
    label, knee_run = model
    tokens, _ = server.startup_line()
    # The planner knows no CPU "GPU"; with --pool-tokens the pool is the logged one and the GPU only names a
    # block size (16) for its own block arithmetic, which for a dense model gives the same pool ÷ context.
    config = TIER_DIR / MODELS[label][2].directory / "config.json"
    result = CliRunner().invoke(app, ["plan", "--model", str(config), "--gpu", "h100",
                                      "--max-model-len", str(MAX_MODEL_LEN), "-c", str(CONTEXT),
                                      "--pool-tokens", str(tokens), "--no-curve", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    agents = json.loads(result.output)["agents"]
    estimate = agents["window_aware_sessions"]
    knee = knee_run.knee[0]
    FIGURES[f"planner ({label})"] = (
        f"agentload plan --pool-tokens {tokens}: {estimate:.2f} agents at {CONTEXT} "
        f"(recommended {agents['recommended_agents']}); measured knee {knee.agents} "
        f"(ratio {knee.agents / estimate:.3f})"
    )
    if reason := compute_bound(knee_run):
        pytest.skip(reason)
    low, high = pool_knee_range(estimate)
    assert low <= knee.agents <= high, FIGURES[f"planner ({label})"]
