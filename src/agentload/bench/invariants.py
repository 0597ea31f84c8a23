"""Statements checked against the numbers they cite: what a saved bench result must never say of itself.

Every figure bench prints comes from a ``RunResult``; each rule below is a relation those figures must keep
(a percentile no larger than the next, a queue wait inside the time to first token, a hit rate between 0 and 1,
the knee's sentence quoting its own evidence). ``check`` returns one sentence per broken rule, naming the level or
knee and the numbers, so a test can run it over every simulated profile and a user over any run
(``agentload report`` shows the same figures).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from agentload.bench.results import OUTPUT_SHORT_RATIO, TURN_STALL_S, Knee, LevelSummary, Percentiles, RunResult
from agentload.bench.search import Search

EPS = 1e-6
# The server's hit rate and the usage one cover the same requests when nothing was preempted (a preempted request
# is looked up again by the server, counted once by usage); a window's edges still let them differ a little.
HIT_AGREEMENT = 0.05
# Shares print to 0.1 % and the evidence keeps four decimals: a quoted share is checked to their rounding.
QUOTED_SHARE = 0.0006


def check(result: RunResult) -> list[str]:
    """Every broken rule of ``result``, one sentence each (empty when its figures agree with each other)."""
    out = [f"level {lv.agents} agents: {why}" for lv in result.levels for why in _level(lv)]
    out.extend(f"synthetic arm at {lv.agents} agents: {why}" for lv in result.synthetic for why in _level(lv))
    by_agents = {(lv.agents, lv.context): lv for lv in result.levels}
    for knee in result.knee:
        out.extend(f"knee {knee.where} @ {knee.context:,}: {why}" for why in _knee(knee, by_agents, result))
    out.extend(_run(result))
    return out


def _ordered(name: str, p: Percentiles) -> Iterator[str]:
    values = [v for v in (p.p50, p.p95, p.p99) if v is not None]
    if any(v < 0 for v in values):
        yield f"{name} has a negative percentile {values}"
    if values != sorted(values):
        yield f"{name} percentiles are not in order (p50 ≤ p95 ≤ p99): {values}"


def _share(name: str, value: float | None) -> Iterator[str]:
    if value is not None and not (-EPS <= value <= 1 + EPS):
        yield f"{name} {value} is not a share between 0 and 1"


def _level(lv: LevelSummary) -> Iterator[str]:
    # 1-3: latencies ordered and non-negative.
    yield from _ordered("TTFT", lv.ttft_s)
    yield from _ordered("ITL", lv.itl_s)
    yield from _ordered("queue wait", lv.queue_wait_s)
    # 4: a request's wait in the queue is part of its time to first token, percentile by percentile.
    for q in ("p50", "p95", "p99"):
        wait, ttft = getattr(lv.queue_wait_s, q), getattr(lv.ttft_s, q)
        if wait is not None and ttft is not None and wait > ttft + EPS:
            yield f"queue wait {q} {wait:.3f} s exceeds TTFT {q} {ttft:.3f} s"
    # 5-12: every rate and share is a share.
    for name, value in (
        ("prefix hit (server)", lv.prefix_hit_rate_server),
        ("prefix hit (usage)", lv.prefix_hit_rate_usage),
        ("offload hit", lv.prefix_hit_rate_offload),
        ("prefix hit (both tiers)", lv.prefix_hit_rate_effective),
        ("prompt share", lv.prefill_share),
        ("computed prefill share", lv.computed_prefill_share),
        ("prefill time share", lv.prefill_time_share),
        ("peak KV", lv.peak_kv_usage),
        ("mean KV", lv.mean_kv_usage),
        ("pass rate", lv.pass_rate),
    ):
        yield from _share(name, value)
    # 13: the computed prompt tokens are some of the prompt tokens, so their share is no larger — unless requests
    # were preempted, whose prompts are looked up and computed again.
    computed, prompt = lv.computed_prefill_share, lv.prefill_share
    if computed is not None and prompt is not None and not lv.preemptions and computed > prompt + 1e-3:
        yield f"computed prefill share {computed:.3f} exceeds the share of all prompt tokens {prompt:.3f}"
    # 14: the prompt share is what the two rates say.
    total = lv.prefill_tps + lv.output_tps
    if lv.prefill_share is not None and total > 0 and abs(lv.prefill_share - lv.prefill_tps / total) > 1e-3:
        yield f"prompt share {lv.prefill_share:.4f} is not prefill ÷ (prefill + output) {lv.prefill_tps / total:.4f}"
    # 15: the peak is at least the mean.
    if lv.peak_kv_usage is not None and lv.mean_kv_usage is not None and lv.mean_kv_usage > lv.peak_kv_usage + EPS:
        yield f"mean KV {lv.mean_kv_usage:.3f} exceeds peak KV {lv.peak_kv_usage:.3f}"
    # 16-17: turns are the requests that completed, and turns/s their rate over the window.
    if lv.turns != lv.requests_ok:
        yield f"{lv.turns} turns but {lv.requests_ok} requests ok"
    if lv.turns_per_s is not None and lv.window_s > 0 and abs(lv.turns_per_s * lv.window_s - lv.turns) > 0.5:
        yield f"turns/s {lv.turns_per_s:.3f} × window {lv.window_s:.1f} s is not its {lv.turns} turns"
    # 18: counts are counts.
    for name, count in (
        ("requests failed", lv.requests_failed),
        ("requests cut", lv.requests_cut),
        ("sessions ended ok", lv.sessions_completed),
        ("sessions ended failed", lv.sessions_failed),
        ("preemptions", lv.preemptions),
        ("recomputed tokens", lv.recomputed_tokens),
        ("output tok/s", lv.output_tps),
        ("prefill tok/s", lv.prefill_tps),
    ):
        if count is not None and (count < 0 or math.isnan(count)):
            yield f"{name} is {count}"
    # 19: the "too few turns" flag says what the counts say.
    if lv.min_turns is not None and lv.too_few_turns != (lv.turns < lv.min_turns):
        yield f"too_few_turns is {lv.too_few_turns} with {lv.turns} turns of {lv.min_turns} wanted"
    # 20: the "output short" flag says what the lengths say.
    ratio = lv.output_ratio
    if ratio is not None and lv.output_short != (ratio < OUTPUT_SHORT_RATIO):
        yield f"output_short is {lv.output_short} with replies at {ratio:.0%} of the requested length"
    # 21: with nothing preempted, the server's reuse (both tiers) and usage's agree.
    effective, usage = lv.prefix_hit_rate_effective, lv.prefix_hit_rate_usage
    if (
        lv.prefix_hit_rate_server is not None
        and effective is not None
        and usage is not None
        and not lv.preemptions
        and lv.turns >= 20
        and abs(effective - usage) > HIT_AGREEMENT
    ):
        yield (
            f"the server's reuse {effective:.1%} (GPU cache and offload tier) and usage's {usage:.1%} disagree by more "
            f"than {HIT_AGREEMENT:.0%} with no preemption"
        )
    yield from _pace(lv)


def _pace(lv: LevelSummary) -> Iterator[str]:
    # 21a: a replayed turn waits until its scheduled time (its previous reply's end + the recorded wait, on the
    # one clock the records carry: ``agent.loop.wait_until``) before it is sent, so no turn starts early: the
    # realised think time is at least the recorded one, and the lateness percentiles are non-negative and ordered.
    recorded, realised = lv.think_recorded_s, lv.think_realised_s
    if recorded is not None and recorded < -EPS:
        yield f"recorded think time {recorded:.6f} s is negative"
    if recorded is not None and realised is not None and realised < recorded - EPS:
        yield f"realised think time {realised:.6f} s is under the recorded {recorded:.6f} s: a turn started early"
    p50, p99 = lv.turn_late_p50_s, lv.turn_late_p99_s
    if p50 is not None and p50 < -EPS:
        yield f"turn lateness p50 {p50:.6f} s is negative: a turn started early"
    if p50 is not None and p99 is not None and p50 > p99 + EPS:
        yield f"turn lateness p50 {p50:.6f} s exceeds its p99 {p99:.6f} s"
    # 21b: the stalls are the judged turns late by more than ``TURN_STALL_S``: a median lateness past it means at
    # least one such turn.
    if p50 is not None and p50 > TURN_STALL_S + EPS and lv.turn_stalls == 0:
        yield f"no stalled turn counted with the turns' lateness p50 at {p50:.6f} s, over {TURN_STALL_S:g} s"
    yield from _sessions(lv)


def _sessions(lv: LevelSummary) -> Iterator[str]:
    # 21c: a replay's turn latency percentiles are ordered and positive (a reply ends after its request is sent).
    p50, p95 = lv.turn_latency_p50_s, lv.turn_latency_p95_s
    if p50 is not None and p50 < -EPS:
        yield f"turn latency p50 {p50:.6f} s is negative"
    if p50 is not None and p95 is not None and p50 > p95 + EPS:
        yield f"turn latency p50 {p50:.6f} s exceeds its p95 {p95:.6f} s"
    # 21d: a timed session is one whose last request completed in the window, so there are at most as many as
    # the window's completed turns, and a ratio exactly when there is one.
    timed = lv.sessions_timed
    if timed is not None and timed > lv.turns:
        yield f"{timed} sessions timed, more than the window's {lv.turns} completed turns that could end them"
    if timed is not None and (lv.session_wall_ratio_p50 is not None) != (timed > 0):
        yield f"session wall ratio {lv.session_wall_ratio_p50} over {timed} timed sessions"
    ratio = lv.session_wall_ratio_p50
    if ratio is not None and ratio < 0:
        yield f"session wall ratio {ratio:.6f} is negative"


async def _unused(agents: int) -> LevelSummary:
    raise AssertionError("the checker judges saved levels; it measures none")


def _knee(knee: Knee, levels: dict[tuple[int, int], LevelSummary], result: RunResult) -> Iterator[str]:
    ev = knee.explanation.evidence
    judged = knee.bound not in ("unmeasured", "unjudged")
    good = levels.get((knee.agents, knee.context))
    bad = levels.get((knee.past_at, knee.context)) if knee.past_at is not None else None
    # 22: a knee rests on measured levels.
    if knee.agents > 0 and good is None:
        yield f"its level of {knee.agents} agents was not measured"
    if knee.past_at is not None and (bad is None or knee.past_at <= knee.agents):
        yield f"the level past it, {knee.past_at} agents, was not measured above it"
    # 23: no knee is claimed from a level that completed no turn.
    if good is not None and good.turns == 0 and knee.bound != "unmeasured":
        yield "claimed from a level that completed no turn"
    # 24: a point ratio only where the knee is bracketed; bounds in order.
    if knee.measured_over_predicted is not None and knee.bound != "bracketed":
        yield f"measured ÷ predicted {knee.measured_over_predicted:.2f} given for a knee bounded {knee.bound!r}"
    if knee.ratio_low is not None and knee.ratio_high is not None and knee.ratio_low > knee.ratio_high + EPS:
        yield f"its ratio bounds are reversed ({knee.ratio_low} > {knee.ratio_high})"
    # 25: the ratio is the knee over the prediction of its context.
    predicted = next((c.predicted for c in result.capacity if (c.target_context or c.context) == knee.context), None)
    ratio = knee.measured_over_predicted
    if ratio is not None and predicted and abs(ratio - knee.agents / predicted) > 1e-6:
        yield f"measured ÷ predicted {knee.measured_over_predicted:.4f} is not {knee.agents} ÷ {predicted:.2f}"
    # 26: the level named past the knee is past on the evidence of every level measured (a search that judged it
    # before a smaller level was measured could have named one that all the levels do not put past).
    tolerance = result.settings.get("tolerance")
    if knee.past_at is not None and bad is not None and not result.settings.get("slo") and judged:
        same = {lv.agents: lv for lv in result.levels if lv.context == knee.context}
        verdicts = Search(_unused, tolerance=float(tolerance) if isinstance(tolerance, int | float) else 0.10,
                          levels=same).verdicts()  # fmt: skip
        if not verdicts[knee.past_at].past:
            yield f"the level named past it, {knee.past_at} agents, is not past the knee on all the levels measured"
    # 27: the evidence names the levels the knee names.
    if judged and "agents_at_knee" in ev and ev["agents_at_knee"] != knee.agents:
        yield f"its evidence is of {ev['agents_at_knee']:g} agents, not {knee.agents}"
    if judged and "agents_past_knee" in ev and ev["agents_past_knee"] != knee.past_at:
        yield f"its evidence past it is of {ev['agents_past_knee']:g} agents, not {knee.past_at}"
    # 28-30: the cause is what the evidence shows.
    cause = knee.explanation.cause
    h_at, h_past = ev.get("prefix_hit_rate_at_knee"), ev.get("prefix_hit_rate_past_knee")
    if cause == "cache_eviction" and h_at is not None and h_past is not None and h_past >= h_at:
        yield f"put down to eviction while the hit rate rose from {h_at:.1%} to {h_past:.1%}"
    pre_at, pre_past = ev.get("preemptions_per_min_at_knee"), ev.get("preemptions_per_min_past_knee")
    if cause == "preemption" and pre_at is not None and pre_past is not None and pre_past <= pre_at:
        yield f"put down to preemption while preemptions went {pre_at:g} → {pre_past:g} a minute"
    if cause == "kv_pool_full" and (
        ev.get("peak_kv_usage_past_knee", 1.0) < 0.9 or not ev.get("mean_waiting_past_knee")
    ):
        yield "put down to a full pool with the pool not full or nothing waiting"
    # 31: a sentence that says step time grows quotes an ITL that grew.
    itl = re.search(
        r"step time grows \(ITL (\d+(?:\.\d+)?) → (\d+(?:\.\d+)?) ms\)", summary := knee.explanation.summary
    )
    if itl and float(itl.group(2)) <= float(itl.group(1)):
        yield f"its sentence says step time grows while quoting {itl.group(0)!r}"
    # 32: the hit rates its sentence quotes are its evidence's.
    quoted = re.search(r"hit rate (?:still )?falls from (\d+\.\d)% to (\d+\.\d)%", summary)
    if quoted and h_at is not None and h_past is not None:
        said = (float(quoted.group(1)) / 100, float(quoted.group(2)) / 100)
        if abs(said[0] - h_at) > QUOTED_SHARE or abs(said[1] - h_past) > QUOTED_SHARE:
            yield f"its sentence quotes {quoted.group(0)!r} against evidence {h_at:.1%} → {h_past:.1%}"
    # 33: "N× the share of prompt tokens missed" is the misses' ratio.
    times = re.search(r"\((\d+(?:\.\d+)?)× the share of prompt tokens missed\)", summary)
    if times and h_at is not None and h_past is not None and h_at < 1:
        ratio = (1 - h_past) / (1 - h_at)
        if abs(float(times.group(1)) - ratio) > 0.051 + 0.01 * ratio:
            yield f"its sentence says {times.group(1)}× the misses, the evidence {ratio:.2f}×"


def _run(result: RunResult) -> Iterator[str]:
    # 34: one workload in the agents' levels; the synthetic arm is apart.
    for lv in result.levels:
        if lv.workload != result.workload:
            yield f"level {lv.agents} agents is of workload {lv.workload!r} in a {result.workload!r} run"
    # 35: real ÷ synthetic is the two arms' output rates.
    if result.real_over_synthetic is not None:
        if not result.synthetic:
            yield "a real ÷ synthetic ratio with no synthetic arm saved"
        else:
            arm = result.synthetic[0]
            real = next((lv for lv in result.levels if lv.agents == arm.agents and lv.context == arm.context), None)
            if real is None:
                yield f"the synthetic arm ran at {arm.agents} agents, a count no agents' level measured"
            elif arm.output_tps > 0 and abs(result.real_over_synthetic - real.output_tps / arm.output_tps) > 1e-6:
                yield (
                    f"real ÷ synthetic {result.real_over_synthetic:.3f} is not {real.output_tps:.1f} ÷ "
                    f"{arm.output_tps:.1f}"
                )
