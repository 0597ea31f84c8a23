"""Knee search and sweep on a scripted throughput curve; SLO parsing; knee explanations from evidence."""

from __future__ import annotations

import pytest

from agentload.bench.analysis import _hist_percentiles, explain_knee
from agentload.bench.results import LevelSummary, Percentiles
from agentload.bench.search import Search, find_knee, parse_slo, sweep
from agentload.clock import run_virtual
from agentload.errors import ConfigError


def level(agents: int, tps: float, *, hit: float = 0.96, pre: float = 0.0, ttft: float = 1.0) -> LevelSummary:
    return LevelSummary(
        level=0, agents=agents, context=40_000, workload="t", window_s=60.0, warmup_s=10.0,
        sessions_completed=0, sessions_failed=0, requests_ok=agents * 10, requests_failed=0, turns=agents * 10,
        output_tps=tps, prefill_tps=10 * tps, throughput_source="server", prefix_hit_rate_server=hit,
        preemptions=pre, ttft_s=Percentiles(p50=ttft, p95=2 * ttft, p99=3 * ttft),
        itl_s=Percentiles(p50=0.02, p95=0.03, p99=0.04),
    )  # fmt: skip


def cliff(knee: int) -> dict[int, LevelSummary]:
    """Throughput rises with agents up to ``knee`` then collapses (a KV cliff)."""
    return {
        n: level(n, 100 * min(n, knee) ** 0.5) if n <= knee else level(n, 40.0, hit=0.1, pre=30.0)
        for n in range(1, 300)
    }


@pytest.mark.parametrize("true_knee", [1, 2, 7, 24, 26, 100, 249])
def test_find_knee_lands_on_the_cliff(true_knee: int) -> None:
    curve = cliff(true_knee)
    probed: list[int] = []

    async def measure(n: int) -> LevelSummary:
        probed.append(n)
        return curve[n]

    search = Search(measure)
    knee = run_virtual(find_knee(search, 40_000, max_agents=250))
    assert knee.agents == true_knee
    assert len(probed) == len(set(probed))  # nothing measured twice
    assert len(probed) <= 18  # 2 × log2(250) + 2: doubling, then bisection
    assert knee.explanation.cause == "cache_eviction"


def test_find_knee_without_a_drop_reports_none_at_the_limit() -> None:
    async def measure(n: int) -> LevelSummary:
        return level(n, 10.0 * n)

    knee = run_virtual(find_knee(Search(measure), 4096, max_agents=64))
    assert knee.agents == 64
    assert knee.explanation.cause == "none"


def test_sweep_agrees_with_search_within_its_resolution() -> None:
    curve = cliff(26)

    async def measure(n: int) -> LevelSummary:
        return curve[n]

    knee = run_virtual(sweep(Search(measure), [1, 8, 16, 24, 32, 48, 64, 128], 40_000))
    assert knee.agents == 24  # the last sweep point before the cliff at 26


def test_slo_breaks_the_level_before_throughput_does() -> None:
    async def measure(n: int) -> LevelSummary:
        return level(n, 10.0 * n, ttft=0.1 * n)  # TTFT p95 = 0.2 n

    knee = run_virtual(find_knee(Search(measure, slo=parse_slo("ttft_p95=2s")), 4096))
    assert knee.agents == 10
    assert knee.explanation.cause == "slo"


@pytest.mark.parametrize("text", ["ttft_p95", "latency_p95=2s", "ttft_p95=-1s", "ttft_p42=1s", "ttft_p95=fast"])
def test_bad_slo_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_slo(text)


def test_slo_units() -> None:
    assert parse_slo("itl_p99=80ms").limit_s == pytest.approx(0.08)
    assert parse_slo("TTFT_P95 = 2s").limit_s == 2.0


def test_explanations_follow_the_evidence() -> None:
    good = level(24, 700.0)
    evicted = explain_knee(good, level(32, 180.0, hit=0.11, pre=0.0))
    assert evicted.cause == "cache_eviction"
    assert evicted.evidence["prefix_hit_rate_past_knee"] == pytest.approx(0.11)
    preempted = explain_knee(good, level(32, 400.0, hit=0.95, pre=60.0))
    assert preempted.cause == "preemption"
    assert preempted.evidence["preemptions_per_min_past_knee"] == pytest.approx(60.0)
    saturated = explain_knee(good, level(32, 500.0, hit=0.96, pre=0.0))
    assert saturated.cause == "compute_saturation"


def test_misses_that_more_than_double_over_five_points_are_eviction_with_the_pool_read_below_full() -> None:
    """A real vLLM one agent past its pool (tier, realistic model): hits 96.6 % → 87.5 %, sampled KV peak 77 %."""
    good, bad = level(6, 41.2, hit=0.966), level(7, 27.7, hit=0.875)
    bad = bad.model_copy(update={"peak_kv_usage": 0.77, "itl_s": Percentiles(p50=0.022, p95=0.03, p99=0.04)})
    why = explain_knee(good.model_copy(update={"peak_kv_usage": 0.47}), bad)
    assert why.cause == "cache_eviction", why.summary
    assert "96.6%" in why.summary
    assert "87.5%" in why.summary
    # A fall of 4 points, misses ×2.2, is not enough on its own: compute, with the fall named rather than denied.
    small = explain_knee(level(6, 41.2, hit=0.966), level(7, 30.0, hit=0.925))
    assert small.cause == "compute_saturation"
    assert "96.6% to 92.5%" in small.summary
    assert "no cache loss" not in small.summary
    none = explain_knee(level(6, 41.2, hit=0.966), level(7, 30.0, hit=0.965))
    assert "no cache loss" in none.summary


def test_histogram_percentiles_of_the_window_increase() -> None:
    start = {0.1: 10.0, 1.0: 10.0, float("inf"): 10.0}
    end = {0.1: 60.0, 1.0: 110.0, float("inf"): 110.0}  # 50 new in (0, 0.1], 50 in (0.1, 1]
    p = _hist_percentiles(start, end)
    assert p.p50 == pytest.approx(0.1)
    assert p.p99 is not None
    assert 0.9 < p.p99 <= 1.0
