"""The knee rule at each of its thresholds, one side and the other (``capacity/knee``'s docstring states them:
10% below the best, a 15-point hit-rate fall with 2× the misses, a 4× and 0.25 s TTFT jump), and the quiet-edge
gate in virtual time: requests that arrive while it is closed keep their spacing, shifted by the drain."""

from __future__ import annotations

import asyncio

import pytest

from agentload.capacity.knee import RULE_TEXT, LevelSignals, Verdict, judge, judge_all
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.backend import QuiesceGate


def lv(
    agents: int,
    tps: float = 100.0,
    *,
    turns_per_s: float | None = None,
    output_trusted: bool = True,
    ttft_p50_s: float | None = None,
    hit_rate: float | None = None,
) -> LevelSignals:
    return LevelSignals(agents, tps, turns_per_s, output_trusted, ttft_p50_s, hit_rate)


def test_the_smallest_level_is_never_past_the_knee() -> None:
    assert judge(lv(1, 0.0), []) == Verdict(past=False)
    assert not judge(lv(4, 0.0), [lv(4), lv(8)]).past  # only smaller levels are references


@pytest.mark.parametrize(
    ("tps", "past"),
    [(90.0, False), (89.9, True)],  # best below is 100: exactly 10% lower is within the tolerance
)
def test_output_throughput_ten_percent_below_the_best(tps: float, past: bool) -> None:
    # The best smaller level (100 at 2 agents) is the reference, not the largest one (95 at 4).
    verdict = judge(lv(8, tps), [lv(2, 100.0), lv(4, 95.0)])
    assert verdict.past is past
    assert verdict.signals == (("output tok/s",) if past else ())


def test_a_level_with_short_replies_is_judged_on_turns_alone() -> None:
    good = [lv(2, 100.0, turns_per_s=1.0)]
    short = lv(4, 50.0, turns_per_s=1.2, output_trusted=False)
    assert not judge(short, good).past  # half the tokens, more turns: the model stopped early, no knee
    slower = lv(4, 50.0, turns_per_s=0.8, output_trusted=False)
    verdict = judge(slower, good)
    assert verdict.signals == ("turns/s",)
    assert verdict.reason == "agent-turns/s 0.8 vs the best 1 below it"


def test_untrusted_smaller_levels_are_not_output_references() -> None:
    # The only smaller level had short replies: there is no output tok/s to compare with.
    good = [lv(2, 1000.0, output_trusted=False)]
    assert not judge(lv(4, 100.0), good).past


@pytest.mark.parametrize(
    ("prev_hit", "hit", "past"),
    [
        # (Values sit a point off each bar, clear of binary floating point's rounding at exactly 5 points.)
        (0.95, 0.89, True),  # a 6-point fall, misses 5% → 11% (2.2×)
        (0.95, 0.91, False),  # 4 points (misses 1.8×): not enough fall
        (0.977, 0.88, True),  # the vLLM tier's tiny model one agent past its pool: misses 2.3% → 12% (5.2×)
        (0.99, 0.96, False),  # misses 4×, but a 3-point fall: noise at a near-perfect hit rate, not a cliff
        (0.50, 0.20, False),  # 30 points, but misses 50% → 80% (1.6×): not a cliff
        (0.70, 0.39, True),  # 31 points, misses 30% → 61% (2.03×)
        (0.70, 0.41, False),  # 29 points, misses 30% → 59% (1.97×)
    ],
)
def test_prefix_hit_collapse_needs_both_the_fall_and_twice_the_misses(prev_hit: float, hit: float, past: bool) -> None:
    verdict = judge(lv(8, hit_rate=hit), [lv(4, hit_rate=prev_hit)])
    assert verdict.past is past
    if past:
        assert verdict.signals == ("prefix hit rate",)
        assert f"at 4 → {hit:.1%}" in verdict.reason


def test_the_hit_rate_reference_is_the_largest_good_level_not_the_best() -> None:
    # 2 agents hit 99%, 4 agents 85%: at 8 agents 80% is judged against 85% (5 points), not 99%.
    assert not judge(lv(8, hit_rate=0.80), [lv(2, hit_rate=0.99), lv(4, hit_rate=0.85)]).past


@pytest.mark.parametrize(
    ("before", "now", "past"),
    [
        (0.1, 0.4, True),  # 4× and 0.3 s
        (0.05, 0.2, False),  # 4× and 0.15 s: a few milliseconds growing is no knee
        (0.1, 0.39, False),  # 3.9×
        (0.1, 0.41, True),  # 4.1× and 0.31 s
        (1.0, 4.0, True),  # exactly 4× and 3 s
    ],
)
def test_ttft_jump_needs_four_times_and_a_quarter_second(before: float, now: float, past: bool) -> None:
    verdict = judge(lv(8, ttft_p50_s=now), [lv(4, ttft_p50_s=before)])
    assert verdict.past is past


def test_every_signal_that_fired_is_named_in_order() -> None:
    good = [lv(4, 100.0, turns_per_s=2.0, hit_rate=0.9, ttft_p50_s=0.2)]
    verdict = judge(lv(8, 50.0, turns_per_s=1.0, hit_rate=0.5, ttft_p50_s=2.0), good)
    assert verdict.signals == ("turns/s", "output tok/s", "prefix hit rate", "ttft")
    assert verdict.decided_by == "turns/s, output tok/s, prefix hit rate, ttft"
    assert len(verdict.reasons) == 4
    assert verdict.reason.count("; ") == 3


def test_a_tighter_tolerance_sees_a_knee_sooner() -> None:
    good = [lv(2, 100.0)]
    assert not judge(lv(4, 93.0), good).past
    assert judge(lv(4, 93.0), good, tolerance=0.05).past


def test_judge_all_sorts_and_keeps_a_past_level_out_of_the_references() -> None:
    # 16 falls past the knee; 32 recovers to 95, which is within 10% of the best good level (100 at 8) — and it
    # is not compared against 16's 60, which is no reference.
    levels = [lv(32, 95.0), lv(8, 100.0), lv(16, 60.0), lv(4, 80.0)]
    verdicts = judge_all(levels)
    assert list(verdicts) == [4, 8, 16, 32]
    assert [verdicts[n].past for n in (4, 8, 16, 32)] == [False, False, True, False]


def test_the_rule_text_states_the_thresholds() -> None:
    assert "5 points" in RULE_TEXT
    assert "2×" in RULE_TEXT
    assert "4×" in RULE_TEXT
    assert "0.25 s" in RULE_TEXT


# -- the quiet-edge gate ---------------------------------------------------------------------------------------
def test_requests_arriving_while_closed_keep_their_spacing_after_the_drain() -> None:
    async def scenario() -> list[tuple[str, float]]:
        clock = LoopClock()
        gate = QuiesceGate(clock)
        started: list[tuple[str, float]] = []

        async def request(name: str, arrive: float, lasts: float) -> None:
            await clock.sleep(arrive - clock.now())
            await gate.enter()
            started.append((name, clock.now()))
            await clock.sleep(lasts)
            gate.leave()

        async def edge() -> None:
            await clock.sleep(1.0)
            gate.close()  # at t = 1: "long" (sent at 0) is still in flight until t = 5
            assert await gate.drained(10.0)
            assert clock.now() == pytest.approx(5.0)
            gate.open()

        await asyncio.gather(request("long", 0.0, 5.0), request("a", 2.0, 0.1), request("b", 3.5, 0.1), edge())
        return started

    started = run_virtual(scenario())
    # a arrived 1 s after the close, b 2.5 s after: released 1 s and 2.5 s after the open at t = 5.
    assert started == [("long", 0.0), ("a", pytest.approx(6.0)), ("b", pytest.approx(7.5))]


def test_an_edge_that_never_goes_quiet_says_so() -> None:
    async def scenario() -> tuple[bool, float, int]:
        clock = LoopClock()
        gate = QuiesceGate(clock)
        await gate.enter()  # a request that never ends
        gate.close()
        quiet = await gate.drained(3.0)
        return quiet, clock.now(), gate.in_flight

    quiet, now, in_flight = run_virtual(scenario())
    assert (quiet, now, in_flight) == (False, pytest.approx(3.0), 1)


def test_an_idle_gate_is_drained_at_once_and_an_open_one_does_not_delay() -> None:
    async def scenario() -> tuple[bool, float]:
        clock = LoopClock()
        gate = QuiesceGate(clock)
        quiet = await gate.drained(5.0)
        await gate.enter()
        gate.leave()
        return quiet, clock.now()

    assert run_virtual(scenario()) == (True, 0.0)
