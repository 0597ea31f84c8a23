"""Numbers and sentences shared by the HTML report and the console tables, so both say the same thing.

Nothing here computes a statistic: every figure comes from the compiled ``RunResult`` as bench/ wrote it.
"""

from __future__ import annotations

from agentload.bench.results import CapacityEstimate, Knee, LevelSummary, RunResult
from agentload.workload.registry import TRACE_PREFIX

DASH = "—"  # a value the run did not measure (as opposed to a measured zero)

CAUSES = {
    "preemption": "preemption",
    "cache_eviction": "prefix-cache eviction",
    "kv_pool_full": "a full KV pool (turns queue for blocks)",
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


def replays_trace(workload: str) -> bool:
    """A trace replay's sessions are the sizes it recorded: ``--context`` (a level's ``context``) sized nothing."""
    return workload.startswith(TRACE_PREFIX)


def context_label(context: int) -> str:
    """40960 → "40k" (binary k, as people name context sizes), 1000 → "1,000"."""
    if context >= 1024 and context % 1024 == 0:
        return f"{context // 1024}k"
    return f"{context:,}"


def ratio_text(knee: Knee) -> str:
    """Measured ÷ predicted capacity as far as the measured levels bound it, with why when it is a bound."""
    if knee.measured_over_predicted is not None:
        return f"{knee.measured_over_predicted:.2f}"
    if knee.ratio_low is not None and knee.ratio_high is not None:
        return f"{knee.ratio_low:.2f}–{knee.ratio_high:.2f} ({knee.ratio_note})"
    if knee.ratio_low is not None:
        return f"≥ {knee.ratio_low:.2f} ({knee.ratio_note})"
    if knee.ratio_high is not None:
        return f"≤ {knee.ratio_high:.2f} ({knee.ratio_note})"
    return ""


def knee_context(knee: Knee) -> str:
    """The context a knee was measured at: "40,960-token context", or for a trace the one it realised (its recorded
    sizes, which ``--context`` did not set)."""
    if knee.realised_context is not None:
        return f"the trace's realised {knee.realised_context:,}-token context"
    return f"{knee.context:,}-token context"


def knee_sentence(knee: Knee) -> str:
    """The knee in words: where, by which criterion, why (the bench's own sentence) and measured ÷ predicted."""
    cause = knee.explanation.cause
    where = f"{knee_context(knee)}, {knee.criterion}"
    if knee.bound == "unmeasured":
        head = f"No knee claimed ({where})"
    elif knee.bound == "unjudged":
        head = f"No knee claimed: no level measured below {knee.agents} agents to judge them against ({where})"
    elif cause == "none":
        head = f"No knee found up to {knee.agents} agents ({where})"
    else:
        if knee.bound == "between" and knee.past_at is not None:
            at = f"between {knee.agents} and {knee.past_at - 1} agents (none measured in between)"
        elif knee.bound == "below" and knee.past_at is not None:
            at = f"below {knee.past_at} agents (no level under {max(knee.agents, 1)} was measured to place it)"
        else:
            at = f"at {knee.agents} agents"
        head = f"Knee {at} ({where}), caused by {CAUSES.get(cause, cause)}"
    if knee.decided_by:
        head += f" (decided by {knee.decided_by})"
    text = f"{head}: {knee.explanation.summary.rstrip('.')}."
    ratio = ratio_text(knee)
    if ratio:
        text += f" Measured ÷ predicted capacity: {ratio}."
    return text


def capacity_sentence(est: CapacityEstimate) -> str:
    # The bench divides by the context the server counted when it measured one; the target is then said beside it.
    realised = ""
    if est.replay:  # a trace's sizes are its recorded ones: no target to say beside them
        realised = ", the trace's realised context (the server's mean)"
    elif est.target_context is not None and est.target_context != est.context:
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
        f"{k.where} ({CAUSES.get(k.explanation.cause, k.explanation.cause)})"
        + (f" @ {context_label(k.context)}" if len(result.knee) > 1 else "")
        for k in result.knee
    )


# The knee's evidence in words: metric name (as the explanation stores it, without _at_knee / _past_knee) → label.
EVIDENCE_LABELS = {
    "agents": "agents",
    "output_tps": "output tok/s",
    "preemptions_per_min": "preemptions/min",
    "prefix_hit_rate": "prefix hit",
    "offload_hit_rate": "loaded from offload",
    "uncached_prompt_tokens_per_s": "prompt tokens computed/s",
    "preempted_tokens_recomputed_per_s": "tokens recomputed after preemption/s",
    "peak_kv_usage": "peak KV",
    "ttft_p50_s": "TTFT p50",
    "itl_p50_s": "ITL p50",
    "mean_running": "running",
    "mean_waiting": "waiting",
    "slots": "slots",
}


def _evidence_value(metric: str, value: float) -> str:
    if metric.endswith(("_rate", "_usage")):
        return f"{value * 100:.1f}%"
    if metric.endswith("_s") and not metric.endswith("per_s"):
        return secs(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.4g}"


def evidence_rows(evidence: dict[str, float]) -> list[tuple[str, str]]:
    """(label, "at the knee → past it") per metric of a knee's evidence, in its order."""
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key in evidence:
        metric = key.removesuffix("_at_knee").removesuffix("_past_knee")
        if metric in seen:
            continue
        seen.add(metric)
        label = EVIDENCE_LABELS.get(metric, metric.replace("_", " "))
        at, past = evidence.get(f"{metric}_at_knee"), evidence.get(f"{metric}_past_knee")
        if at is not None and past is not None:
            rows.append((label, f"{_evidence_value(metric, at)} → {_evidence_value(metric, past)}"))
        elif past is not None:
            rows.append((f"{label} (past the knee)", _evidence_value(metric, past)))
        elif at is not None:
            rows.append((f"{label} (at the knee)", _evidence_value(metric, at)))
        else:
            rows.append((label, _evidence_value(metric, evidence[key])))
    return rows


def evidence_text(evidence: dict[str, float]) -> str:
    """ "agents 24 → 25; output tok/s 706 → 480; prefix hit 97.1% → 12.4%; …": at the knee → past it."""
    return "; ".join(f"{label} {value}" for label, value in evidence_rows(evidence))


def synthetic_lines(result: RunResult) -> list[str]:
    """The matched synthetic arm beside the agents: what it sent, the ratio, and its causes."""
    if result.real_over_synthetic is None:
        return []
    lines = [f"Real agents ÷ matched synthetic load, output throughput: {result.real_over_synthetic:.2f}"]
    for arm in result.synthetic:
        lines[0] += (
            f" (the synthetic arm, {arm.workload}, at {arm.agents} agents: {arm.output_tps:,.0f} output tok/s, "
            "single-turn unique prompts sent back to back)"
        )
    lines.extend(f"  {why}" for why in result.synthetic_why)
    return lines
