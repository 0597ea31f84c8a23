"""Numbers and sentences shared by the HTML report and the console tables, so both say the same thing.

Nothing here computes a statistic: every figure comes from the compiled ``RunResult`` as bench/ wrote it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentload.bench.results import CapacityEstimate, Knee, LevelSummary, RunResult

DASH = "—"  # a value the run did not measure (as opposed to a measured zero)

CAUSES = {
    "preemption": "preemption",
    "cache_eviction": "prefix-cache eviction",
    "compute_saturation": "compute saturation",
    "slo": "the SLO",
    "none": "no drop",
}


def num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return DASH
    return f"{value:,.{digits}f}"


def count(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def pct(value: float | None, digits: int = 0) -> str:
    return DASH if value is None else f"{value * 100:.{digits}f}%"


def secs(value: float | None) -> str:
    """Seconds the way people read latencies: 0.0423 → "42.3 ms", 1.84 → "1.84 s"."""
    if value is None:
        return DASH
    if value < 1.0:
        return f"{value * 1e3:.1f} ms"
    if value < 100.0:
        return f"{value:.2f} s"
    return f"{value:,.0f} s"


def tokens(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def context_label(context: int) -> str:
    """40960 → "40k" (binary k, as people name context sizes), 1000 → "1,000"."""
    if context >= 1024 and context % 1024 == 0:
        return f"{context // 1024}k"
    return f"{context:,}"


def knee_sentence(knee: Knee) -> str:
    """The knee in words: where, by which criterion, why (the bench's own sentence) and measured ÷ predicted."""
    cause = knee.explanation.cause
    where = f"{knee.context:,}-token context, {knee.criterion}"
    if cause == "none":
        head = f"No knee found up to {knee.agents} agents ({where})"
    else:
        head = f"Knee at {knee.agents} agents ({where}), caused by {CAUSES.get(cause, cause)}"
    text = f"{head}: {knee.explanation.summary.rstrip('.')}."
    if knee.measured_over_predicted is not None:
        text += f" Measured ÷ predicted capacity: {knee.measured_over_predicted:.2f}."
    return text


def capacity_sentence(est: CapacityEstimate) -> str:
    if est.pool_tokens is None or est.sessions is None:
        return f"KV pool unknown ({est.source}): no capacity estimate at {est.context:,} tokens per session."
    return (
        f"KV pool {est.pool_tokens:,} tokens ÷ {est.context:,} tokens per session ≈ {est.sessions:,.1f} sessions "
        f"({est.label}; pool from {est.source})."
    )


def is_knee_level(result: RunResult, level: LevelSummary) -> bool:
    return any(k.agents == level.agents and k.context == level.context for k in result.knee)


def _pair(a: str, b: str) -> str:
    return DASH if a == DASH and b == DASH else f"{a} / {b}"


def _prefix_hits(lv: LevelSummary) -> str:
    # Side by side on purpose: the server counts a preempted request's lookups again, usage counts it once.
    return _pair(pct(lv.prefix_hit_rate_server, 1), pct(lv.prefix_hit_rate_usage, 1))


def _ttft(lv: LevelSummary) -> str:
    parts = [secs(lv.ttft_s.p50), secs(lv.ttft_s.p95), secs(lv.ttft_s.p99)]
    return DASH if all(p == DASH for p in parts) else " / ".join(parts)


# The per-level table, the same in the console and the HTML report. A column whose every cell is DASH (pass
# rate for an unscored workload, queue wait from a server without that histogram) is left out.
LEVEL_COLUMNS: list[tuple[str, Callable[[LevelSummary], str]]] = [
    ("agents", lambda lv: str(lv.agents)),
    ("context", lambda lv: context_label(lv.context)),
    ("sessions ok / failed", lambda lv: f"{lv.sessions_completed} / {lv.sessions_failed}"),
    ("requests ok / failed", lambda lv: f"{lv.requests_ok:,} / {lv.requests_failed:,}"),
    ("pass rate", lambda lv: pct(lv.pass_rate, 1)),
    ("output tok/s", lambda lv: num(lv.output_tps, 0)),
    ("prefill tok/s", lambda lv: num(lv.prefill_tps, 0)),
    ("tok/s from", lambda lv: lv.throughput_source),
    ("prefill share", lambda lv: pct(lv.prefill_share)),
    (
        "prefix hit server / usage",
        lambda lv: _pair(pct(lv.prefix_hit_rate_server, 1), pct(lv.prefix_hit_rate_usage, 1)),
    ),
    ("TTFT p50 / p95 / p99", _ttft),
    ("ITL p50", lambda lv: secs(lv.itl_s.p50)),
    ("queue wait p95", lambda lv: secs(lv.queue_wait_s.p95)),
    ("peak KV", lambda lv: pct(lv.peak_kv_usage)),
    ("preemptions", lambda lv: count(lv.preemptions)),
]


@dataclass(frozen=True)
class LevelTable:
    headers: list[str]
    rows: list[list[str]]
    knee_rows: list[bool]  # the row is a knee level (highlighted)


def level_table(result: RunResult) -> LevelTable:
    """The per-level table of a run, levels in (context, agents) order."""
    ordered = sorted(result.levels, key=lambda lv: (lv.context, lv.agents))
    cells = [[fn(lv) for _, fn in LEVEL_COLUMNS] for lv in ordered]
    keep = [i for i in range(len(LEVEL_COLUMNS)) if any(row[i] != DASH for row in cells)]
    return LevelTable(
        headers=[LEVEL_COLUMNS[i][0] for i in keep],
        rows=[[row[i] for i in keep] for row in cells],
        knee_rows=[is_knee_level(result, lv) for lv in ordered],
    )


def knee_short(result: RunResult) -> str:
    """ "24 (preemption)" per knee, for one-line listings."""
    if not result.knee:
        return DASH
    return ", ".join(
        f"{k.agents} ({CAUSES.get(k.explanation.cause, k.explanation.cause)})"
        + (f" @ {context_label(k.context)}" if len(result.knee) > 1 else "")
        for k in result.knee
    )
