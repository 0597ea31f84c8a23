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
    """Seconds the way people read latencies: 0.0423 → "42.3 ms", 0.16 → "160 ms", 1.84 → "1.84 s"."""
    if value is None:
        return DASH
    if value < 0.1:
        return f"{value * 1e3:.1f} ms"
    if value < 1.0:
        return f"{value * 1e3:.0f} ms"
    if value < 100.0:
        return f"{value:.2f} s"
    return f"{value:,.0f} s"


def secs_triple(values: tuple[float | None, float | None, float | None]) -> str:
    """p50 / p95 / p99 in one unit, chosen by the largest: "160 / 352 / 560 ms", "2.34 / 5.15 / 8.19 s"."""
    present = [v for v in values if v is not None]
    if not present:
        return DASH
    if max(present) < 1.0:
        digits = 1 if max(present) < 0.1 else 0
        return " / ".join(DASH if v is None else f"{v * 1e3:.{digits}f}" for v in values) + " ms"
    return " / ".join(DASH if v is None else f"{v:.2f}" for v in values) + " s"


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


def _prefix_hits(lv: LevelSummary) -> str:
    # Side by side on purpose: the server counts a preempted request's lookups again, usage counts it once.
    server, usage = lv.prefix_hit_rate_server, lv.prefix_hit_rate_usage
    if server is None and usage is None:
        return DASH
    return " / ".join(DASH if v is None else f"{v * 100:.1f}" for v in (server, usage)) + "%"


def _ttft(lv: LevelSummary) -> str:
    return secs_triple((lv.ttft_s.p50, lv.ttft_s.p95, lv.ttft_s.p99))


# The per-level table, the same in the console and the HTML report. A column whose every cell is DASH (pass
# rate for an unscored workload, queue wait from a server without that histogram) is left out.
LEVEL_COLUMNS: list[tuple[str, Callable[[LevelSummary], str]]] = [
    # Headers break into two short lines (the HTML shows the break as a space): a terminal table of 15 columns
    # only fits when no header is wider than its numbers.
    ("agents", lambda lv: str(lv.agents)),
    ("context", lambda lv: context_label(lv.context)),
    ("sessions\nok / failed", lambda lv: f"{lv.sessions_completed} / {lv.sessions_failed}"),
    ("requests\nok / failed", lambda lv: f"{lv.requests_ok:,} / {lv.requests_failed:,}"),
    ("pass\nrate", lambda lv: pct(lv.pass_rate, 1)),
    ("output\ntok/s", lambda lv: num(lv.output_tps, 0)),
    ("prefill\ntok/s", lambda lv: num(lv.prefill_tps, 0)),
    ("tok/s\nfrom", lambda lv: lv.throughput_source),
    ("prefill\nshare", lambda lv: pct(lv.prefill_share)),
    ("prefix hit\nserver / usage", _prefix_hits),
    ("TTFT\np50 / p95 / p99", _ttft),
    ("ITL\np50", lambda lv: secs(lv.itl_s.p50)),
    ("queue\nwait p95", lambda lv: secs(lv.queue_wait_s.p95)),
    ("peak\nKV", lambda lv: pct(lv.peak_kv_usage)),
    ("preempt-\nions", lambda lv: count(lv.preemptions)),
]
# Columns that usually hold one value for a whole run: the console states them once, in the title.
CONSTANT_COLUMNS = ("context", "tok/s\nfrom")


@dataclass(frozen=True)
class LevelTable:
    headers: list[str]
    rows: list[list[str]]
    knee_rows: list[bool]  # the row is a knee level (highlighted)
    constants: list[str]  # folded columns, as "40k context" (only with fold_constant)


def level_table(result: RunResult, *, fold_constant: bool = False) -> LevelTable:
    """The per-level table of a run, levels in (context, agents) order.

    With ``fold_constant``, a ``CONSTANT_COLUMNS`` column holding one value on every row is left out and named
    in ``constants`` instead (the console's title says "40k context · tok/s from server").
    """
    ordered = sorted(result.levels, key=lambda lv: (lv.context, lv.agents))
    cells = [[fn(lv) for _, fn in LEVEL_COLUMNS] for lv in ordered]
    keep: list[int] = []
    constants: list[str] = []
    for i, (header, _) in enumerate(LEVEL_COLUMNS):
        column = {row[i] for row in cells}
        if column == {DASH}:
            continue
        if fold_constant and header in CONSTANT_COLUMNS and len(column) == 1:
            value = column.pop()
            constants.append(f"{header.replace(chr(10), ' ')} {value}" if "\n" in header else f"{value} {header}")
            continue
        keep.append(i)
    return LevelTable(
        headers=[LEVEL_COLUMNS[i][0] for i in keep],
        rows=[[row[i] for i in keep] for row in cells],
        knee_rows=[is_knee_level(result, lv) for lv in ordered],
        constants=constants,
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
