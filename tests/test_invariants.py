"""Every built-in simulated profile × workload, swept through its KV pool's estimate: no figure bench saves
contradicts another (``bench.invariants``); and each planted contradiction is caught."""

from __future__ import annotations

import pytest

from agentload.bench.invariants import check
from agentload.bench.orchestrate import BenchPlan, run_bench
from agentload.bench.results import Knee, KneeExplanation, LevelSummary, Percentiles, RunResult
from agentload.bench.target import sim_target
from agentload.capacity.profile import builtin_profiles, load_profile
from agentload.clock import run_virtual
from agentload.workload.registry import get_workload

CONTEXT_CAP = 40_960  # the article's context; a smaller max-model-len is used where a profile has one
MAX_AGENTS = 36  # past the dense estimate of the largest pools here, few enough to simulate in seconds


def sweep_for(profile: str) -> tuple[int, list[int]]:
    """The context and a sweep from one agent through the dense pool ÷ context estimate to half again past it."""
    p = load_profile(profile)
    context = min(p.max_model_len, CONTEXT_CAP)
    estimate = p.num_blocks * p.block_size / context
    counts = sorted({1, max(2, round(estimate / 2)), max(3, round(estimate)), max(4, round(estimate * 1.5))})
    return context, [min(n, MAX_AGENTS) for n in counts]


def measured(profile: str, workload: str) -> RunResult:
    context, counts = sweep_for(profile)
    plan = BenchPlan(
        make_target=lambda: sim_target(profile),
        workload=get_workload(workload),
        contexts=[context],
        mode="sweep",
        agents=sorted(set(counts)),
        warmup_s=5.0,
        window_s=30.0,
    )
    result: RunResult = run_virtual(run_bench(plan))[0]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["agentic-hold", "agentic"])
@pytest.mark.parametrize("profile", builtin_profiles())
def test_no_saved_figure_contradicts_another(profile: str, workload: str) -> None:
    result = measured(profile, workload)
    assert result.levels, "nothing was measured"
    assert check(result) == []


def level(agents: int, **update: object) -> LevelSummary:
    base = LevelSummary(
        level=0, agents=agents, context=40_960, workload="agentic-hold", window_s=60.0, warmup_s=10.0,
        sessions_completed=0, sessions_failed=0, requests_ok=60, requests_failed=0, turns=60, turns_per_s=1.0,
        output_tps=100.0, prefill_tps=9900.0, prefill_share=0.99, throughput_source="server",
        prefix_hit_rate_server=0.97, prefix_hit_rate_usage=0.97, ttft_s=Percentiles(p50=0.1, p95=0.2, p99=0.3),
        queue_wait_s=Percentiles(p50=0.01, p95=0.05, p99=0.1), peak_kv_usage=0.5, mean_kv_usage=0.4,
    )  # fmt: skip
    return base.model_copy(update=update)


def run(levels: list[LevelSummary], knee: Knee | None = None, **update: object) -> RunResult:
    result = RunResult(
        run_id="r", created="2026-12-07", agentload_version="0", target="t", model="m", workload="agentic-hold",
        mode="sweep", levels=levels, knee=[knee] if knee else [],
    )  # fmt: skip
    return result.model_copy(update=update)


def eviction_knee(summary: str, **update: object) -> Knee:
    evidence = {"agents_at_knee": 24, "agents_past_knee": 32, "prefix_hit_rate_at_knee": 0.966,
                "prefix_hit_rate_past_knee": 0.191}  # fmt: skip
    knee = Knee(agents=24, context=40_960, criterion="c", past_at=32,
                explanation=KneeExplanation(cause="cache_eviction", summary=summary, evidence=evidence))  # fmt: skip
    return knee.model_copy(update=update)


GOOD = "the prefix-cache hit rate falls from 96.6% to 19.1% (23.8× the share of prompt tokens missed)"


def test_a_consistent_run_passes() -> None:
    assert check(run([level(24), level(32, prefix_hit_rate_server=0.191, prefix_hit_rate_usage=0.19)],
                     eviction_knee(GOOD))) == []  # fmt: skip


@pytest.mark.parametrize(
    ("planted", "caught"),
    [
        ({"queue_wait_s": Percentiles(p50=0.15, p95=0.285, p99=0.3)}, "queue wait p50 0.150 s exceeds TTFT p50"),
        ({"ttft_s": Percentiles(p50=0.3, p95=0.2, p99=0.4)}, "TTFT percentiles are not in order"),
        ({"prefix_hit_rate_server": 1.2}, "is not a share"),
        ({"prefill_share": 0.5}, "prompt share 0.5000 is not prefill ÷ (prefill + output)"),
        ({"computed_prefill_share": 0.999}, "computed prefill share 0.999 exceeds"),
        ({"turns": 59}, "59 turns but 60 requests ok"),
        ({"turns_per_s": 2.0}, "turns/s 2.000 × window"),
        ({"mean_kv_usage": 0.6}, "mean KV 0.600 exceeds peak KV"),
        ({"min_turns": 64, "too_few_turns": False}, "too_few_turns is False with 60 turns of 64"),
        ({"prefix_hit_rate_usage": 0.80}, "disagree by more than 5%"),
        ({"requests_failed": -1}, "requests failed is -1"),
        ({"output_requested_mean": 100.0, "output_realised_mean": 50.0}, "output_short is False"),
    ],
)
def test_a_planted_level_contradiction_is_caught(planted: dict[str, object], caught: str) -> None:
    found = check(run([level(24, **planted)]))
    assert any(caught in line for line in found), found


@pytest.mark.parametrize(
    ("knee", "caught"),
    [
        (eviction_knee(GOOD.replace("96.6%", "98.6%")), "its sentence quotes"),
        (eviction_knee(GOOD.replace("23.8×", "2.6×")), "its sentence says 2.6× the misses"),
        (eviction_knee(GOOD, bound="between", measured_over_predicted=0.65), "given for a knee bounded 'between'"),
        (eviction_knee(GOOD, past_at=48), "the level past it, 48 agents, was not measured"),
        (eviction_knee(GOOD, agents=16), "its level of 16 agents was not measured"),
        (eviction_knee(GOOD, ratio_low=2.0, ratio_high=1.0), "ratio bounds are reversed"),
        (
            eviction_knee(GOOD).model_copy(
                update={
                    "explanation": KneeExplanation(
                        cause="cache_eviction",
                        summary=GOOD,
                        evidence={"prefix_hit_rate_at_knee": 0.5, "prefix_hit_rate_past_knee": 0.6},
                    )
                }
            ),
            "put down to eviction while the hit rate rose",
        ),
    ],
)
def test_a_planted_knee_contradiction_is_caught(knee: Knee, caught: str) -> None:
    levels = [level(24), level(32, prefix_hit_rate_server=0.191, prefix_hit_rate_usage=0.19)]
    found = check(run(levels, knee))
    assert any(caught in line for line in found), found


def test_a_knee_on_a_level_with_no_turn_is_caught() -> None:
    empty = level(24, turns=0, requests_ok=0, turns_per_s=0.0)
    found = check(run([empty, level(32)], eviction_knee(GOOD)))
    assert any("claimed from a level that completed no turn" in line for line in found), found


def test_a_ratio_to_a_synthetic_arm_that_is_not_its_own_is_caught() -> None:
    arm = level(24, workload="synthetic 40,557 in / 204 out", output_tps=50.0, prefill_tps=9950.0, prefill_share=0.995)
    ok = run([level(24)], real_over_synthetic=2.0, synthetic=[arm])
    assert check(ok) == []
    assert any(
        "real ÷ synthetic 3.000 is not" in line for line in check(ok.model_copy(update={"real_over_synthetic": 3.0}))
    )
    assert any("no synthetic arm saved" in line for line in check(run([level(24)], real_over_synthetic=2.0)))
    mixed = run([level(24), arm])
    assert any("of workload 'synthetic" in line for line in check(mixed))


def test_step_time_said_to_grow_must_have_grown() -> None:
    """A knee once read "compute-bound: step time grows (ITL 25.6 → 25.6 ms)"."""
    summary = "past 39 agents the server is compute-bound: step time grows (ITL 25.6 → 25.6 ms) with no preemption"
    knee = Knee(agents=24, context=40_960, criterion="c", past_at=32,
                explanation=KneeExplanation(cause="compute_saturation", summary=summary))  # fmt: skip
    found = check(run([level(24), level(32)], knee))
    assert any("says step time grows while quoting" in line for line in found), found


def test_a_level_named_past_the_knee_that_all_the_levels_do_not_put_past_is_caught() -> None:
    """A knee search judged 40 agents past the knee before 39 was measured; on all the levels it is not."""
    flat = [level(n, ttft=Percentiles(p50=t, p95=t, p99=t)) for n, t in ((32, 0.07), (39, 0.3), (40, 0.33))]
    knee = Knee(agents=39, context=40_960, criterion="c", past_at=40,
                explanation=KneeExplanation(cause="compute_saturation", summary="s"))  # fmt: skip
    found = check(run(flat, knee))
    assert any("the level named past it, 40 agents, is not past" in line for line in found), found
