"""What a knee may claim: only what its measured levels bound (bracketed, between, below, at least, nothing)."""

from __future__ import annotations

import pytest

from agentload.bench.results import Knee, LevelSummary, Percentiles
from agentload.bench.search import Search, find_knee, sweep, with_ratio
from agentload.clock import run_virtual
from agentload.report.text import knee_sentence, ratio_text
from tests.test_bench_search import cliff, level


def swept(counts: list[int], curve: dict[int, LevelSummary], predicted: float = 24.5) -> tuple[str, Knee]:
    async def measure(n: int) -> LevelSummary:
        return curve[n]

    knee = run_virtual(sweep(Search(measure), counts, 40_000))
    knee = with_ratio(knee, predicted)
    return knee_sentence(knee), knee


def test_a_close_pair_brackets_the_knee_and_gives_the_ratio() -> None:
    text, knee = swept([1, 8, 16, 24, 32], cliff(24))
    assert knee.bound == "bracketed"
    assert knee.measured_over_predicted == pytest.approx(24 / 24.5)
    assert "Knee at 24 agents" in text
    assert "Measured ÷ predicted capacity: 0.98." in text


def test_a_wide_gap_gives_a_range_not_a_point() -> None:
    """--sweep 1,16,64,128 once printed "Knee at 16" and a ratio of 0.65 with nothing measured from 17 to 63."""
    text, knee = swept([1, 16, 64, 128], cliff(24))
    assert knee.bound == "between"
    assert knee.measured_over_predicted is None
    assert knee.ratio_low == pytest.approx(16 / 24.5)
    assert knee.ratio_high == pytest.approx(63 / 24.5)
    assert knee.where == "16–63"
    assert "Knee between 16 and 63 agents" in text
    assert "Knee at" not in text
    assert "0.65–2.57" in text


def test_no_level_past_the_knee_is_only_a_lower_bound() -> None:
    """--sweep 1,4 once printed "Measured ÷ predicted capacity: 0.16" with no knee found."""
    text, knee = swept([1, 4], cliff(24))
    assert knee.bound == "at_least"
    assert knee.measured_over_predicted is None
    assert knee.where == "≥ 4"
    assert "No knee found up to 4 agents" in text
    assert "≥ 0.16 (no level up to 4 agents was past the knee)" in text


def test_a_first_level_past_the_cliff_bounds_the_knee_from_above_only() -> None:
    """--sweep 96,128: 96 has nothing smaller to be judged against, so "knee at 96" would claim what was not seen."""
    curve = cliff(24)
    # 96 and 128 both past a cliff at 24, but 128 worse still: the rule sees a drop from 96 to 128.
    curve[128] = curve[128].model_copy(update={"output_tps": 5.0})
    text, knee = swept([96, 128], curve)
    assert knee.bound == "below"
    assert knee.where == "< 128"
    assert knee.measured_over_predicted is None
    assert knee.ratio_high == pytest.approx(127 / 24.5)
    assert "Knee below 128 agents" in text


def test_a_level_with_no_turn_claims_no_knee() -> None:
    """A trace that ended inside the warm-up left every level at 0 turns, yet "No knee up to 1024 … 42.04"."""
    empty = {n: level(n, 0.0).model_copy(update={"requests_ok": 0, "turns": 0}) for n in (1, 4, 16)}
    text, knee = swept([1, 4, 16], empty)
    assert knee.bound == "unmeasured"
    assert knee.where == "—"
    assert ratio_text(knee) == ""
    assert text.startswith("No knee claimed")
    assert "completed no turn" in text


def test_a_single_level_above_one_agent_is_not_judged() -> None:
    text, knee = swept([16], cliff(24))
    assert knee.bound == "unjudged"
    assert ratio_text(knee) == ""
    assert "No knee claimed" in text


def test_old_results_without_bounds_read_as_bracketed() -> None:

    old = Knee.model_validate_json(
        '{"agents": 24, "context": 40960, "criterion": "c", "measured_over_predicted": 0.98,'
        ' "explanation": {"cause": "preemption", "summary": "s"}}'
    )
    assert old.bound == "bracketed"
    assert old.where == "24"
    assert ratio_text(old) == "0.98"


def test_queue_wait_never_exceeds_ttft_at_the_same_percentile() -> None:
    """vLLM's queue histogram's first bucket is 0–0.3 s; interpolating in it read a p95 wait of 0.28 s beside a
    TTFT p95 of 0.07 s. Every request's wait is part of its TTFT, so the percentile is bounded by TTFT's."""
    from agentload.bench.analysis import LevelData, summarise
    from agentload.endpoint.records import RequestIds, RequestRecord
    from agentload.endpoint.samples import RawSample, ServerSample

    records = [
        RequestRecord(
            ids=RequestIds(run="r", level=0, agent=f"a{i}", turn=0),
            t_sent=1.0 + i * 0.1,
            t_first_token=1.05 + i * 0.1,
            t_done=1.5 + i * 0.1,
            prompt_tokens=100,
            completion_tokens=10,
        )
        for i in range(40)
    ]
    buckets0 = {0.3: 0.0, 0.5: 0.0, float("inf"): 0.0}
    buckets1 = {0.3: 40.0, 0.5: 40.0, float("inf"): 40.0}
    samples = [RawSample(ServerSample(t=0.6), buckets0), RawSample(ServerSample(t=9.9), buckets1)]
    data = LevelData(level=0, agents=4, context=1000, workload="t", start=0.0, window_start=0.5, end=10.0,
                     records=records, samples=samples)  # fmt: skip
    s = summarise(data)
    for q in ("p50", "p95", "p99"):
        wait, ttft = getattr(s.queue_wait_s, q), getattr(s.ttft_s, q)
        assert wait is not None
        assert ttft is not None
        assert wait <= ttft


def test_offload_hits_count_as_reuse_in_the_knee_rule() -> None:
    """With a CPU tier, the GPU cache's hit rate falls as contexts outgrow it while the tier loads them back:
    the knee rule reads both tiers' reuse, not the GPU's alone."""
    from agentload.bench.search import signals

    gpu_only = level(32, 800.0, hit=0.61).model_copy(update={"prefix_hit_rate_offload": 0.378})
    assert gpu_only.prefix_hit_rate_effective == pytest.approx(0.988)
    assert signals(gpu_only).hit_rate == pytest.approx(0.988)
    plain = level(32, 800.0, hit=0.61)
    assert signals(plain).hit_rate == pytest.approx(0.61)


def test_unused_percentiles_stay_empty() -> None:
    assert Percentiles().p95 is None


def test_a_search_bisects_again_when_a_smaller_level_moves_the_verdict_of_a_larger_one() -> None:
    """TTFT rises gently from 32 agents to 44, then jumps at 45. Measured after 32 alone, 40 (0.33 s) is a 4× jump
    over 32 (0.07 s); once 39 (0.30 s) is measured, it is not. A search that stopped there reported "knee at 39"
    with a level past it that all the evidence does not put past; it bisects again, to the real jump."""

    def ttft(n: int) -> float:
        if n <= 32:
            return 0.07
        return 0.07 + 0.0325 * (n - 32) if n <= 44 else 2.0 + 0.1 * (n - 45)

    curve = {n: level(n, 880.0).model_copy(update={"ttft_s": Percentiles(p50=ttft(n), p95=ttft(n), p99=ttft(n))})
             for n in range(1, 65)}  # fmt: skip
    measured: list[int] = []

    async def measure(n: int) -> LevelSummary:
        measured.append(n)
        return curve[n]

    knee = run_virtual(find_knee(Search(measure), 40_000, max_agents=64))
    assert (knee.agents, knee.past_at, knee.bound) == (44, 45, "bracketed"), measured
    verdicts = Search(measure, levels={n: curve[n] for n in measured}).verdicts()
    assert verdicts[45].past
    assert not verdicts[44].past
    assert {39, 40} <= set(measured)  # the first bracket, 39–40, was measured and then left
