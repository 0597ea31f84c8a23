"""The figures and sentences the HTML report and the console share (``report/text``): a value not measured reads
as a dash, never as 0; latencies switch unit where people do; the knee and capacity sentences carry every part
the result holds and none it does not."""

from __future__ import annotations

import pytest

from agentload.bench.results import CapacityEstimate, Knee, KneeExplanation, LevelSummary, RunResult
from agentload.report import text


def test_not_measured_is_a_dash_and_zero_is_zero() -> None:
    assert [text.num(None), text.count(None), text.pct(None), text.secs(None), text.tokens(None)] == ["—"] * 5
    assert [text.num(0.0), text.count(0), text.pct(0.0), text.tokens(0)] == ["0.0", "0", "0%", "0"]


def test_number_formats() -> None:
    assert text.num(12345.678) == "12,345.7"
    assert text.num(2.0, digits=3) == "2.000"
    assert text.count(1234.5) == "1,234"  # banker's rounding of .5: an even count
    assert text.pct(0.125, digits=1) == "12.5%"
    assert text.pct(1.0) == "100%"
    assert text.tokens(131072) == "131,072"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0, "0.0 ms"),
        (0.0423, "42.3 ms"),
        (0.0999, "99.9 ms"),
        (0.1, "100 ms"),  # from 100 ms on, whole milliseconds
        (0.4567, "457 ms"),
        (1.0, "1.00 s"),
        (1.84, "1.84 s"),
        (99.99, "99.99 s"),
        (100.0, "100 s"),
        (3725.0, "3,725 s"),
    ],
)
def test_a_latency_on_its_own_in_the_unit_people_read(seconds: float, shown: str) -> None:
    assert text.secs(seconds) == shown


@pytest.mark.parametrize(
    ("context", "label"),
    [(40960, "40k"), (131072, "128k"), (1024, "1k"), (1000, "1,000"), (4000, "4,000"), (1536, "1,536"), (512, "512")],
)
def test_context_labels_use_binary_k_only_when_whole(context: int, label: str) -> None:
    assert text.context_label(context) == label


def _knee(cause: str = "preemption", **fields: object) -> Knee:
    explanation = KneeExplanation.model_validate(
        {"cause": cause, "summary": "running requests were preempted once the pool filled."}
    )
    return Knee.model_validate(
        {"agents": 24, "context": 40960, "criterion": "throughput peak", "explanation": explanation, **fields}
    )


def test_knee_sentence_names_where_why_and_the_ratio() -> None:
    sentence = text.knee_sentence(_knee(measured_over_predicted=0.9123, decided_by="ttft"))
    assert sentence == (
        "Knee at 24 agents (40,960-token context, throughput peak), caused by preemption (decided by ttft): "
        "running requests were preempted once the pool filled. Measured ÷ predicted capacity: 0.91."
    )


def test_no_knee_found_says_how_far_it_looked() -> None:
    sentence = text.knee_sentence(_knee(cause="none"))
    assert sentence.startswith("No knee found up to 24 agents (40,960-token context, throughput peak): ")
    assert "caused by" not in sentence
    assert "Measured ÷ predicted" not in sentence  # no ratio in the result: none claimed
    assert sentence.endswith("once the pool filled.")  # the summary's own full stop is not doubled


def test_every_cause_reads_as_words() -> None:
    assert "caused by slots full (queueing for a slot)" in text.knee_sentence(_knee(cause="slots_full"))
    assert "caused by prefix-cache eviction" in text.knee_sentence(_knee(cause="cache_eviction"))
    assert "caused by the SLO" in text.knee_sentence(_knee(cause="slo"))


def _estimate(**fields: object) -> CapacityEstimate:
    base: dict[str, object] = {
        "pool_tokens": 655360,
        "block_size": 16,
        "context": 40960,
        "sessions": 16.0,
        "source": "cache_config_info",
    }
    return CapacityEstimate.model_validate({**base, **fields})


def test_capacity_sentence_shows_the_division() -> None:
    assert text.capacity_sentence(_estimate()) == (
        "KV pool 655,360 tokens ÷ 40,960 tokens per session ≈ 16.0 sessions (dense-attention estimate; a lower "
        "bound for sliding-window / sparse attention; pool from cache_config_info)."
    )


def test_capacity_sentence_names_the_realised_context_beside_the_target() -> None:
    sentence = text.capacity_sentence(_estimate(context=41000, target_context=40960, sessions=15.98))
    assert "÷ 41,000 tokens per session ≈ 16.0 sessions, realised context 41,000 (target 40,960)" in sentence
    same = text.capacity_sentence(_estimate(target_context=40960))
    assert "realised" not in same  # realised equal to the target says nothing more


def test_capacity_sentence_with_a_shared_system_prompt() -> None:
    sentence = text.capacity_sentence(_estimate(shared_prefix_tokens=4096, sessions_shared_prefix=17.7777))
    assert "with the 4,096-token system prompt every agent shares stored once, ≈ 17.8 sessions" in sentence
    # Half the pair is not enough to claim the shared-prefix figure.
    assert "system prompt" not in text.capacity_sentence(_estimate(shared_prefix_tokens=4096))


def test_a_slot_count_below_the_pool_fit_is_named_as_the_prediction() -> None:
    # 655,360 ÷ 40,960 = 16 sessions by memory, but 3 slots: 3 run at once.
    sentence = text.capacity_sentence(_estimate(slots=3))
    assert sentence.endswith("≈ 16.0 sessions (dense-attention estimate; a lower bound for sliding-window / sparse "
                             "attention; pool from cache_config_info); the server has 3 slots, so at most 3 agents "
                             "run at once (the prediction).")  # fmt: skip
    # More slots than the pool holds: the pool decides, and the slots are not mentioned.
    assert "slots" not in text.capacity_sentence(_estimate(slots=32))


def test_an_unknown_pool_claims_no_estimate() -> None:
    sentence = text.capacity_sentence(_estimate(pool_tokens=None, sessions=None, source="not reported"))
    assert sentence == "KV pool unknown (not reported): no capacity estimate at 40,960 tokens per session."


def _result(knees: list[Knee]) -> RunResult:
    level = LevelSummary(
        level=0, agents=24, context=40960, workload="agentic", window_s=60.0, warmup_s=10.0, sessions_completed=0,
        sessions_failed=0, requests_ok=10, requests_failed=0, turns=10, output_tps=1.0, prefill_tps=1.0,
        throughput_source="server",
    )  # fmt: skip
    return RunResult(
        run_id="r", created="2026-01-01T00:00:00", agentload_version="0", target="t", model="m", workload="w",
        mode="find-knee", levels=[level], knee=knees,
    )  # fmt: skip


def test_knee_short_listing() -> None:
    assert text.knee_short(_result([])) == "—"
    assert text.knee_short(_result([_knee()])) == "24 (preemption)"  # one context: no "@"
    two = [_knee(), _knee(cause="slo", agents=8, context=131072)]
    assert text.knee_short(_result(two)) == "24 (preemption) @ 40k, 8 (the SLO) @ 128k"


def test_the_knee_level_is_matched_on_agents_and_context() -> None:
    result = _result([_knee()])
    level = result.levels[0]
    assert text.is_knee_level(result, level)
    assert not text.is_knee_level(result, level.model_copy(update={"context": 8192}))
    assert not text.is_knee_level(result, level.model_copy(update={"agents": 23}))


# The unit used to be picked before rounding: 0.9996 s printed "1000 ms", 99.996 s "100.00 s".
@pytest.mark.parametrize(("seconds", "shown"), [(0.09996, "100 ms"), (0.9996, "1.00 s"), (99.996, "100 s")])
def test_a_latency_that_rounds_up_to_the_next_unit_is_shown_in_it(seconds: float, shown: str) -> None:
    assert text.secs(seconds) == shown
