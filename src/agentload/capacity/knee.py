"""The knee rule, in one place: bench judges measured levels with it, the planner's curve simulated ones.

A level of N agents is *past the knee* when, against the smaller levels that are not past it, any of these holds:

* **throughput falls**: agent-turns/s more than ``tolerance`` below the best smaller level's, or output tok/s
  more than ``tolerance`` below the best (only where output length is the workload's, not the model's early
  stop nor a held session's shortened ask: a level flagged for short or clamped replies is judged on turns/s
  alone, since its tok/s counts other lengths than its neighbours');
* **the prefix-hit rate collapses**: it falls by at least ``HIT_COLLAPSE_DROP`` (5 points) from the largest good
  level's, and its misses (prompt tokens to recompute) at least double — the KV cliff, whatever a noisy tok/s says.
  Both bars: at a near-perfect hit rate a fall of a point or two doubles the misses; and 5 points, not more, because
  one agent past a real pool loses about 10 (the vLLM tier: 97.7 % → 88 %, misses ×5), where a 15-point bar let
  the knee fall a level late. ``bench.analysis.explain_knee`` calls the same fall eviction;
* **TTFT p50 jumps several-fold**: at least ``TTFT_JUMP`` × the largest good level's, and by at least
  ``TTFT_JUMP_MIN_S`` (so a few milliseconds growing to a few more do not count) — requests queue for prefill.

Preemptions and KV usage explain a knee (``bench.analysis.explain_knee``) but do not decide one: a full pool is the
normal state of a well-used server, and a few preemptions cost less than the tolerance.

The knee is the largest count not past it. ``Verdict.signals`` names what decided, so the explanation can say it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

KNEE_TOLERANCE = 0.10
HIT_COLLAPSE_DROP = 0.05
HIT_COLLAPSE_MISS_RATIO = 2.0
TTFT_JUMP = 4.0
TTFT_JUMP_MIN_S = 0.25


@dataclass(frozen=True)
class LevelSignals:
    """What the rule reads of one level, measured (bench) or simulated (planner curve)."""

    agents: int
    output_tps: float
    turns_per_s: float | None = None
    output_trusted: bool = True  # output tok/s measures the workload's reply lengths
    ttft_p50_s: float | None = None
    hit_rate: float | None = None


@dataclass(frozen=True)
class Verdict:
    past: bool
    signals: tuple[str, ...] = ()  # which tests put the level past the knee, e.g. ("prefix hit rate",)
    reasons: tuple[str, ...] = field(default=())  # the same, with the numbers

    @property
    def decided_by(self) -> str:
        return ", ".join(self.signals)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def judge(level: LevelSignals, good: Sequence[LevelSignals], tolerance: float = KNEE_TOLERANCE) -> Verdict:
    """Is ``level`` past the knee, given the smaller levels ``good`` that are not? (see the module docstring)"""
    smaller = [g for g in good if g.agents < level.agents]
    if not smaller:
        return Verdict(past=False)
    prev = max(smaller, key=lambda g: g.agents)
    signals: list[str] = []
    reasons: list[str] = []

    turns = [g.turns_per_s for g in smaller if g.turns_per_s is not None]
    if level.turns_per_s is not None and turns:
        best = max(turns)
        if level.turns_per_s < (1.0 - tolerance) * best:
            signals.append("turns/s")
            reasons.append(f"agent-turns/s {level.turns_per_s:.3g} vs the best {best:.3g} below it")
    if level.output_trusted:
        trusted = [g.output_tps for g in smaller if g.output_trusted]
        if trusted and level.output_tps < (1.0 - tolerance) * max(trusted):
            signals.append("output tok/s")
            reasons.append(f"output tok/s {level.output_tps:.4g} vs the best {max(trusted):.4g} below it")
    if level.hit_rate is not None and prev.hit_rate is not None:
        drop = prev.hit_rate - level.hit_rate
        misses = (1.0 - level.hit_rate) / max(1e-9, 1.0 - prev.hit_rate)
        if drop >= HIT_COLLAPSE_DROP and misses >= HIT_COLLAPSE_MISS_RATIO:
            signals.append("prefix hit rate")
            reasons.append(
                f"prefix-hit rate {prev.hit_rate:.1%} at {prev.agents} → {level.hit_rate:.1%} "
                f"({misses:.1f}× the misses)"
            )
    if level.ttft_p50_s is not None and prev.ttft_p50_s is not None:
        before, now = prev.ttft_p50_s, level.ttft_p50_s
        if now >= TTFT_JUMP * before and now - before >= TTFT_JUMP_MIN_S:
            signals.append("ttft")
            reasons.append(f"TTFT p50 {before:.3g} s at {prev.agents} → {now:.3g} s ({now / max(before, 1e-9):.1f}×)")
    return Verdict(past=bool(signals), signals=tuple(signals), reasons=tuple(reasons))


def judge_all(levels: Sequence[LevelSignals], tolerance: float = KNEE_TOLERANCE) -> dict[int, Verdict]:
    """Every level judged against the good ones below it, in ascending agent count."""
    good: list[LevelSignals] = []
    out: dict[int, Verdict] = {}
    for level in sorted(levels, key=lambda lv: lv.agents):
        verdict = judge(level, good, tolerance)
        out[level.agents] = verdict
        if not verdict.past:
            good.append(level)
    return out


RULE_TEXT = (
    f"the largest agent count not past the knee; a level is past it when agent-turns/s (or output tok/s, where "
    f"replies have the requested length and the turns asked the lengths the workload drew) falls more than the "
    f"tolerance below the best smaller level's, or the prefix-hit rate falls {HIT_COLLAPSE_DROP * 100:g} points or "
    f"more with {HIT_COLLAPSE_MISS_RATIO:g}× the misses, or TTFT p50 jumps {TTFT_JUMP:g}× (and {TTFT_JUMP_MIN_S:g} s) "
    f"over the largest good level's"
)
