"""Numbers and sentences shared by the HTML report and the console tables, so both say the same thing.

Nothing here computes a statistic: every figure comes from the compiled ``RunResult`` as bench/ wrote it.
"""

from __future__ import annotations

from agentload.bench.results import CapacityEstimate, Knee, LevelSummary, RunResult

DASH = "—"  # a value the run did not measure (as opposed to a measured zero)

CAUSES = {
    "preemption": "preemption",
    "cache_eviction": "prefix-cache eviction",
    "slots_full": "slots full (queueing for a slot)",
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
    """One latency on its own (a plot's hover) the way people read it: 0.0423 → "42.3 ms", 1.84 → "1.84 s".

    A table column picks one unit for all its cells instead (``report.levels.time_unit``).
    """
    if value is None:
        return DASH
    # The unit is chosen on the rounded figure: 0.9996 s is "1.00 s", not "1000 ms".
    ms = value * 1e3
    if round(ms, 1) < 100.0:
        return f"{ms:.1f} ms"
    if round(ms) < 1000:
        return f"{ms:.0f} ms"
    if round(value, 2) < 100.0:
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
    if knee.decided_by:
        head += f" (decided by {knee.decided_by})"
    text = f"{head}: {knee.explanation.summary.rstrip('.')}."
    if knee.measured_over_predicted is not None:
        text += f" Measured ÷ predicted capacity: {knee.measured_over_predicted:.2f}."
    return text


def capacity_sentence(est: CapacityEstimate) -> str:
    # The bench divides by the context the server counted when it measured one; the target is then said beside it.
    realised = ""
    if est.target_context is not None and est.target_context != est.context:
        realised = f", realised context {est.context:,} (target {est.target_context:,})"
    if est.pool_tokens is None or est.sessions is None:
        return f"KV pool unknown ({est.source}): no capacity estimate at {est.context:,} tokens per session{realised}."
    shared = ""
    if est.sessions_shared_prefix is not None and est.shared_prefix_tokens is not None:
        shared = (
            f"; with the {est.shared_prefix_tokens:,}-token system prompt every agent shares stored once, "
            f"≈ {est.sessions_shared_prefix:,.1f} sessions (the prediction the knee is compared with)"
        )
    # A slot server runs at most its slot count at once however large its pool, so the prediction is the smaller.
    pool_fit = est.sessions_shared_prefix if est.sessions_shared_prefix is not None else est.sessions
    slots = ""
    if est.slots is not None and est.slots < pool_fit:
        slots = f"; the server has {est.slots} slots, so at most {est.slots} agents run at once (the prediction)"
    return (
        f"KV pool {est.pool_tokens:,} tokens ÷ {est.context:,} tokens per session ≈ {est.sessions:,.1f} sessions"
        f"{realised} ({est.label}; pool from {est.source}){shared}{slots}."
    )


def is_knee_level(result: RunResult, level: LevelSummary) -> bool:
    return any(k.agents == level.agents and k.context == level.context for k in result.knee)


def knee_short(result: RunResult) -> str:
    """ "24 (preemption)" per knee, for one-line listings."""
    if not result.knee:
        return DASH
    return ", ".join(
        f"{k.agents} ({CAUSES.get(k.explanation.cause, k.explanation.cause)})"
        + (f" @ {context_label(k.context)}" if len(result.knee) > 1 else "")
        for k in result.knee
    )
