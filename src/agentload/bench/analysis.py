"""Records + server samples of one level → its LevelSummary; levels → the knee and why it is there.

Throughput comes from the server's counters when it has them (deltas across the measurement window), otherwise
from the usage fields of the requests that finished inside the window; the summary says which. Prefix-cache
reuse is reported both ways, side by side, because they can disagree (preempted requests are looked up again
by the server; usage counts a request once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from agentload.bench.results import (
    OUTPUT_CLAMPED_RATIO,
    OUTPUT_SHORT_RATIO,
    TURN_STALL_S,
    KneeExplanation,
    LevelSummary,
    Percentiles,
)
from agentload.endpoint.records import ErrorKind, RequestRecord, UsageSource
from agentload.endpoint.samples import RawSample, ServerSample
from agentload.workload.base import PaceTruth, SessionWall


class PaceOf(Protocol):
    """``workload.base.ReplayPace.turn_pace``: the pace of the turns of ``records`` due at or after ``due_from``."""

    def __call__(self, records: Sequence[RequestRecord], *, due_from: float = ...) -> PaceTruth | None: ...


class SessionsOf(Protocol):
    """``workload.base.ReplaySessions.session_walls``: the sessions of ``records`` that ended at or after
    ``ended_from``, each its realised and recorded wall time."""

    def __call__(self, records: Sequence[RequestRecord], *, ended_from: float = ...) -> tuple[SessionWall, ...]: ...


@dataclass
class LevelData:
    """What one level accumulated while it ran (times on the run's clock, seconds since the run began)."""

    level: int
    agents: int
    context: int
    workload: str
    start: float
    window_start: float
    end: float
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[RawSample] = field(default_factory=list)
    t0: float = 0.0  # the run's clock origin: records carry absolute clock times, levels run-relative ones
    sessions_ok: int = 0
    sessions_failed: int = 0
    passed: int = 0
    scored: int = 0
    min_turns: int | None = None  # completed turns the window wanted (None: no such goal)
    output_controlled: bool = False  # exact output lengths were asked for (``endpoint.output``)
    notes: list[str] = field(default_factory=list)  # what the runner saw that the summary should say
    # Turns that asked for fewer output tokens than the workload drew, (agent, turn) → drawn (``reply_clamped``).
    drawn: dict[tuple[str, int], int] = field(default_factory=dict)
    lost: str | None = None  # set: the server was lost during this level (why), which stopped it early
    cut_requests: int = 0  # requests the level cut at its edges when its grace ran out (``bench.runner``)
    # A replayed trace's prefix-hit ceiling over the records it is given (``workload.base.ReplayCeiling``).
    ceiling: Callable[[Sequence[RequestRecord]], float | None] | None = None
    # A replayed trace's recorded against realised think times (``workload.base.ReplayPace``).
    pace: PaceOf | None = None
    # A replayed trace's sessions, each its realised against its recorded wall time (``workload.base.ReplaySessions``).
    sessions: SessionsOf | None = None


def _pct(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles()
    p = np.percentile(np.asarray(values, dtype=float), (50, 95, 99))
    return Percentiles(p50=float(p[0]), p95=float(p[1]), p99=float(p[2]))


def _delta(a: ServerSample, b: ServerSample, name: str) -> float | None:
    x, y = getattr(a, name), getattr(b, name)
    if x is None or y is None:
        return None
    return float(y - x)


def _hist_percentiles(start: dict[float, float], end: dict[float, float]) -> Percentiles:
    """Percentiles of a Prometheus histogram's increase over the window (linear within a bucket)."""
    if not end:
        return Percentiles()
    bounds = sorted(end)
    counts = [end[b] - start.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return Percentiles()
    out: list[float | None] = []
    for q in (0.5, 0.95, 0.99):
        rank = q * total
        prev_bound, prev_count, value = 0.0, 0.0, None
        for bound, count in zip(bounds, counts, strict=True):
            if count >= rank:
                if bound == float("inf"):
                    value = prev_bound
                else:
                    span = count - prev_count
                    value = prev_bound + (bound - prev_bound) * ((rank - prev_count) / span if span else 1.0)
                break
            prev_bound, prev_count = bound, count
        out.append(value)
    return Percentiles(p50=out[0], p95=out[1], p99=out[2])


def _at_most(value: float | None, bound: float | None) -> float | None:
    return value if value is None or bound is None else min(value, bound)


def _computed_share(ok: Sequence[RequestRecord]) -> float | None:
    """Computed prefill ÷ (computed prefill + generated), from usage, where every request reported its cached tokens."""
    if not ok or any(r.cached_tokens is None for r in ok):
        return None
    computed = sum(r.prompt_tokens - (r.cached_tokens or 0) for r in ok)
    total = computed + sum(r.completion_tokens for r in ok)
    return computed / total if total > 0 else None


@dataclass(frozen=True)
class _Counters:
    """What the server's own counters say over a level's window (their deltas from its first sample to its last)."""

    output_tps: float = 0.0
    prefill_tps: float = 0.0
    source: Literal["server", "usage"] = (
        "usage"  # "server": the throughputs are the counters'; "usage": none, the requests' usage decides
    )
    prefix_server: float | None = None
    preemptions: float | None = None
    recomputed: float | None = None
    offload_rate: float | None = None
    offload_tps: float | None = None
    computed_share: float | None = None
    time_share: float | None = None
    queue: Percentiles = field(default_factory=Percentiles)


def _counters(first: RawSample, last: RawSample) -> _Counters:
    """The window's counter deltas; ``last`` is later than ``first``."""
    a, b = first.sample, last.sample
    span = b.t - a.t
    gen = _delta(a, b, "generation_tokens")
    prompt = _delta(a, b, "prompt_tokens")
    output_tps = prefill_tps = 0.0
    source: Literal["server", "usage"] = "usage"
    if gen is not None and prompt is not None:
        output_tps, prefill_tps, source = gen / span, prompt / span, "server"
    queries = _delta(a, b, "prefix_queries")
    hits = _delta(a, b, "prefix_hits")
    prefix_server = hits / queries if queries and hits is not None else None
    ext_queries = _delta(a, b, "external_queries")
    ext_hits = _delta(a, b, "external_hits")
    # vLLM's connector counts every scheduled prompt token as a query, as its GPU cache does; where only the
    # hits are exported (LMCache's own counter), the GPU cache's queries are the same tokens.
    looked_up = ext_queries or queries
    offload_rate = offload_tps = computed_share = time_share = None
    if looked_up and ext_hits is not None:
        offload_rate, offload_tps = ext_hits / looked_up, ext_hits / span
    if queries and hits is not None and gen is not None:
        # Looked-up tokens less those any cache served are the ones prefill computed (llama.cpp's queries
        # are processed + cached, so the same difference holds there).
        computed = max(0.0, queries - hits - (ext_hits or 0.0))
        computed_share = computed / (computed + gen) if computed + gen > 0 else None
    prefill_s = _delta(a, b, "prefill_time_s")
    decode_s = _delta(a, b, "decode_time_s")
    if prefill_s is not None and decode_s is not None and prefill_s + decode_s > 0:
        time_share = prefill_s / (prefill_s + decode_s)
    return _Counters(
        output_tps=output_tps,
        prefill_tps=prefill_tps,
        source=source,
        prefix_server=prefix_server,
        preemptions=_delta(a, b, "preemptions"),
        recomputed=_delta(a, b, "recomputed_tokens"),
        offload_rate=offload_rate,
        offload_tps=offload_tps,
        computed_share=computed_share,
        time_share=time_share,
        queue=_hist_percentiles(first.queue_buckets, last.queue_buckets),
    )


@dataclass(frozen=True)
class _Lengths:
    """The window's prompt + reply sizes and its replies' lengths against what was asked for and drawn."""

    contexts: list[int]
    requested: float | None
    realised: float | None
    short: bool
    drawn: float | None
    clamped: bool


def _lengths(ok: Sequence[RequestRecord], data: LevelData) -> _Lengths:
    counted = [r for r in ok if r.usage_source is UsageSource.SERVER]
    asked = [r for r in counted if r.requested_tokens is not None]
    requested = float(np.mean([r.requested_tokens or 0 for r in asked])) if asked else None
    realised = float(np.mean([r.completion_tokens for r in asked])) if asked else None
    # What the workload drew for the same turns, before a held session shortened a long draw to stay at its
    # context (a server that counts a sent-back reply as longer than it was generated makes that common).
    drawn = (
        float(np.mean([data.drawn.get((r.ids.agent, r.ids.turn), r.requested_tokens or 0) for r in asked]))
        if asked
        else None
    )
    return _Lengths(
        contexts=[r.prompt_tokens + r.completion_tokens for r in counted],
        requested=requested,
        realised=realised,
        short=requested is not None and realised is not None and realised < OUTPUT_SHORT_RATIO * requested,
        drawn=drawn,
        clamped=requested is not None and drawn is not None and requested < OUTPUT_CLAMPED_RATIO * drawn,
    )


def _warnings(data: LevelData, completed: int, lengths: _Lengths, too_few: bool) -> list[str]:
    """The runner's notes, then what the window's figures cannot be trusted for."""
    warnings = list(data.notes)
    requested, realised, drawn = lengths.requested, lengths.realised, lengths.drawn
    if lengths.short and requested and realised is not None:
        share_out = realised / requested
        if data.output_controlled:
            warnings.append(
                f"replies averaged {share_out:.0%} of the requested length although exact lengths were asked for "
                "(ignore_eos / min_tokens): the server ignores them, so output tok/s is the model's, not the workload's"
            )
        else:
            warnings.append(
                f"replies averaged {share_out:.0%} of the requested length (the model stopped early and the engine "
                "was not asked for exact lengths): output tok/s does not measure the workload's shape"
            )
    if lengths.clamped and requested is not None and drawn:
        warnings.append(
            f"turns asked for {requested / drawn:.0%} of the reply lengths the workload drew ({requested:.1f} of "
            f"{drawn:.1f} tokens a turn): held sessions shortened replies to stay at the context, so output tok/s "
            "is not compared with other levels (the server counts a reply sent back as longer than it was generated)"
        )
    if too_few:
        warnings.append(
            f"only {completed} completed turns in the window (wanted {data.min_turns}): its figures are noisy; "
            "give it a longer --window"
        )
    return warnings


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _pace_fields(data: LevelData) -> dict[str, float | None]:
    """A replayed trace's think times and turn lateness over the window's turns.

    The turns judged are those due inside the window (their previous reply's end + recorded wait at or after the
    window's start) and done by its end, as every window figure's are. Their previous replies are looked up in all
    of the level's records: the warm-up's are kept, so a window's first turn, whose reply came before the window,
    counts. A turn that fell due while the start edge was closed (``endpoint.backend.QuiesceGate``) went out when
    it opened, inside the window, and is left out: its extra wait is the edge's, not the replay's."""
    if data.pace is None:
        return {}
    w0, w1 = data.t0 + data.window_start, data.t0 + data.end
    truth = data.pace([r for r in data.records if r.t_done <= w1 + 1e-9], due_from=w0 - 1e-9)
    if truth is None:
        return {}
    lateness = np.asarray(truth.lateness_s, dtype=float)
    late = np.percentile(lateness, (50, 99))
    return {
        "think_recorded_s": truth.recorded_wait_s,
        "think_realised_s": truth.realised_wait_s,
        "turn_late_p50_s": float(late[0]),
        "turn_late_p99_s": float(late[1]),
        "turn_stalls": int(np.count_nonzero(lateness > TURN_STALL_S)),
    }


def _turn_fields(data: LevelData, ok: Sequence[RequestRecord]) -> dict[str, float | None]:
    """A replayed trace's turn latency over the window's completed turns: from the turn's first send (a retried
    turn's first attempt, so the retry's delay is the turn's, as an agent waiting on it sees it) to its reply's
    end. Only for replays (``data.pace`` set): a trace's turns are its sessions' steps, timed against its record."""
    if data.pace is None or not ok:
        return {}
    first: dict[tuple[str, int], float] = {}
    for r in data.records:
        key = (r.ids.agent, r.ids.turn)
        first[key] = min(r.t_sent, first.get(key, r.t_sent))
    latency = np.percentile([r.t_done - first[r.ids.agent, r.ids.turn] for r in ok], (50, 95))
    return {"turn_latency_p50_s": float(latency[0]), "turn_latency_p95_s": float(latency[1])}


def _session_fields(data: LevelData) -> dict[str, float | None]:
    """A replayed trace's sessions whose last request was the window's (sent and done in it, as every window
    figure's requests are), their earlier requests looked up in all of the level's records, warm-up included: each
    one's realised wall time ÷ its recorded one, p50, and how many (0 and no ratio when none ended in the window)."""
    if data.sessions is None:
        return {}
    w0, w1 = data.t0 + data.window_start, data.t0 + data.end
    walls = data.sessions([r for r in data.records if r.t_done <= w1 + 1e-9], ended_from=w0 - 1e-9)
    ratios = [w.realised_s / w.recorded_s for w in walls]
    return {
        "session_wall_ratio_p50": float(np.percentile(ratios, 50)) if ratios else None,
        "sessions_timed": len(ratios),
    }


def summarise(data: LevelData) -> LevelSummary:
    w0, w1 = data.window_start, data.end
    window = max(w1 - w0, 1e-9)
    # The window's edges are quiet (endpoint.backend.QuiesceGate): a request belongs to it when it was sent and done
    # inside it.
    in_window = [r for r in data.records if r.t_sent - data.t0 >= w0 - 1e-9 and r.t_done - data.t0 <= w1 + 1e-9]
    ok = [r for r in in_window if r.ok]
    # A request the level cut at its window's end did not fail on the server's side: counted apart.
    cut = sum(1 for r in in_window if r.error is ErrorKind.CUT)
    samples = [s for s in data.samples if w0 - 1e-9 <= s.sample.t <= w1 + 1e-9]
    server = _Counters()
    if samples and samples[-1].sample.t > samples[0].sample.t:
        server = _counters(samples[0], samples[-1])
    output_tps, prefill_tps = server.output_tps, server.prefill_tps
    if server.source == "usage":
        output_tps = sum(r.completion_tokens for r in ok) / window
        prefill_tps = sum(r.prompt_tokens for r in ok) / window
    prompt_total = sum(r.prompt_tokens for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    kv = [s.sample.kv_usage for s in samples if s.sample.kv_usage is not None]
    ttft_pct = _pct([r.ttft for r in ok if r.ttft is not None])
    # A request's wait in the queue is part of its time to first token, so each percentile of the one is at most
    # the same percentile of the other. The server's histogram places a percentile only within its bucket (vLLM's
    # first is 0–0.3 s), where interpolation can read a wait longer than the whole TTFT: bounded by it here.
    queue = Percentiles(**{q: _at_most(getattr(server.queue, q), getattr(ttft_pct, q)) for q in ("p50", "p95", "p99")})
    lengths = _lengths(ok, data)
    too_few = data.min_turns is not None and len(ok) < data.min_turns
    return LevelSummary(
        level=data.level,
        agents=data.agents,
        context=data.context,
        workload=data.workload,
        window_s=window,
        warmup_s=w0 - data.start,
        sessions_completed=data.sessions_ok,
        sessions_failed=data.sessions_failed,
        requests_ok=len(ok),
        requests_failed=len(in_window) - len(ok) - cut,
        requests_cut=cut,
        turns=len(ok),
        pass_rate=(data.passed / data.scored) if data.scored else None,
        output_tps=output_tps,
        prefill_tps=prefill_tps,
        throughput_source=server.source,
        prefill_share=prefill_tps / (prefill_tps + output_tps) if (prefill_tps + output_tps) > 0 else None,
        computed_prefill_share=server.computed_share if server.computed_share is not None else _computed_share(ok),
        prefill_time_share=server.time_share,
        prefix_hit_rate_server=server.prefix_server,
        prefix_hit_rate_usage=(sum(cached) / prompt_total) if cached and prompt_total else None,
        prefix_hit_ceiling=data.ceiling(ok) if data.ceiling is not None else None,
        prefix_hit_rate_offload=server.offload_rate,
        offload_loaded_tps=server.offload_tps,
        ttft_s=ttft_pct,
        itl_s=_pct([g for r in ok for g in r.itl()]),
        queue_wait_s=queue,
        peak_kv_usage=max(kv) if kv else None,
        mean_kv_usage=_mean(kv),
        mean_running=_mean([s.sample.running for s in samples if s.sample.running is not None]),
        mean_waiting=_mean([s.sample.waiting for s in samples if s.sample.waiting is not None]),
        preemptions=server.preemptions,
        recomputed_tokens=server.recomputed,
        turns_per_s=len(ok) / window,
        min_turns=data.min_turns,
        too_few_turns=too_few,
        context_mean=_mean(lengths.contexts),
        context_p95=float(np.percentile(lengths.contexts, 95)) if lengths.contexts else None,
        output_requested_mean=lengths.requested,
        output_realised_mean=lengths.realised,
        output_controlled=data.output_controlled,
        output_short=lengths.short,
        output_drawn_mean=lengths.drawn,
        output_clamped=lengths.clamped,
        warnings=_warnings(data, len(ok), lengths, too_few),
        **_pace_fields(data),
        **_turn_fields(data, ok),
        **_session_fields(data),
    )


# Step time (ITL p50) that rose by less than this share did not grow: a sentence says it held.
STEP_GROWTH = 0.05


def _preemptions_per_min(s: LevelSummary) -> float:
    return (s.preemptions or 0.0) / s.window_s * 60.0


def _knee_evidence(good: LevelSummary, bad: LevelSummary, slots: int | None) -> dict[str, float]:
    """The numbers behind a knee, at it and just past it (the order is the one the saved evidence has)."""
    ev: dict[str, float] = {
        "agents_at_knee": good.agents,
        "agents_past_knee": bad.agents,
        "output_tps_at_knee": round(good.output_tps, 1),
        "output_tps_past_knee": round(bad.output_tps, 1),
        "preemptions_per_min_at_knee": round(_preemptions_per_min(good), 2),
        "preemptions_per_min_past_knee": round(_preemptions_per_min(bad), 2),
    }
    # Tokens an offload tier loaded are not recomputed either: the reuse that decides is both tiers'.
    h_good, h_bad = good.prefix_hit_rate_effective, bad.prefix_hit_rate_effective
    if h_good is not None and h_bad is not None:
        ev["prefix_hit_rate_at_knee"] = round(h_good, 4)
        ev["prefix_hit_rate_past_knee"] = round(h_bad, 4)
    if good.prefix_hit_rate_offload is not None and bad.prefix_hit_rate_offload is not None:
        ev["offload_hit_rate_at_knee"] = round(good.prefix_hit_rate_offload, 4)
        ev["offload_hit_rate_past_knee"] = round(bad.prefix_hit_rate_offload, 4)
    for name, s in (("at_knee", good), ("past_knee", bad)):
        h = s.prefix_hit_rate_effective
        if h is not None:  # the prompt tokens prefill computed because no cache held them
            ev[f"uncached_prompt_tokens_per_s_{name}"] = round(s.prefill_tps * (1.0 - h), 1)
    if good.recomputed_tokens is not None and bad.recomputed_tokens is not None:
        ev["preempted_tokens_recomputed_per_s_past_knee"] = round(bad.recomputed_tokens / bad.window_s, 1)
    if good.peak_kv_usage is not None and bad.peak_kv_usage is not None:
        ev["peak_kv_usage_at_knee"] = round(good.peak_kv_usage, 3)
        ev["peak_kv_usage_past_knee"] = round(bad.peak_kv_usage, 3)
    if good.ttft_s.p50 is not None and bad.ttft_s.p50 is not None:
        ev["ttft_p50_s_at_knee"] = round(good.ttft_s.p50, 3)
        ev["ttft_p50_s_past_knee"] = round(bad.ttft_s.p50, 3)
    if good.itl_s.p50 is not None and bad.itl_s.p50 is not None:
        ev["itl_p50_s_at_knee"] = round(good.itl_s.p50, 4)
        ev["itl_p50_s_past_knee"] = round(bad.itl_s.p50, 4)
    if good.mean_running is not None and bad.mean_running is not None:
        ev["mean_running_at_knee"] = round(good.mean_running, 2)
        ev["mean_running_past_knee"] = round(bad.mean_running, 2)
    if bad.mean_waiting is not None:
        ev["mean_waiting_past_knee"] = round(bad.mean_waiting, 2)
    if slots is not None:
        ev["slots"] = slots
    return ev


@dataclass(frozen=True)
class _Drop:
    """The two levels either side of a knee and what every cause's test reads of them."""

    good: LevelSummary
    bad: LevelSummary
    slots: int | None
    pinned: bool
    ev: dict[str, float]
    h_good: float | None  # the reuse of both cache tiers, at the knee and past it
    h_bad: float | None
    hit_drop: float
    miss_ratio: float
    pool_full: bool
    pre_up: float  # the rise in preemptions a minute

    @classmethod
    def of(cls, good: LevelSummary, bad: LevelSummary, slots: int | None, pinned: bool) -> _Drop:
        h_good, h_bad = good.prefix_hit_rate_effective, bad.prefix_hit_rate_effective
        return cls(
            good=good,
            bad=bad,
            slots=slots,
            pinned=pinned,
            ev=_knee_evidence(good, bad, slots),
            h_good=h_good,
            h_bad=h_bad,
            hit_drop=(h_good - h_bad) if (h_good is not None and h_bad is not None) else 0.0,
            # With 40k-token contexts a few points of hit rate are a lot of prefill: 98.7% → 96.8% is 2.5× the
            # tokens to recompute. So a hit-rate fall counts as eviction when it is large, or when the misses at
            # least grow by half while the pool is full.
            miss_ratio=(1.0 - h_bad) / max(1e-9, 1.0 - h_good) if (h_good is not None and h_bad is not None) else 1.0,
            pool_full=(bad.peak_kv_usage or 0.0) >= 0.9,
            pre_up=_preemptions_per_min(bad) - _preemptions_per_min(good),
        )

    @property
    def hit_fell(self) -> bool:
        """The reuse fell by at least a point: small enough to be named, not to be a cause on its own."""
        return self.h_good is not None and self.h_bad is not None and self.hit_drop >= 0.01


def _slots_full(d: _Drop) -> str | None:
    """A slot server (llama.cpp) with more agents than slots.

    A turn then waits for a slot when all are busy, and the slot it gets holds another agent's prompt (each slot
    caches only its last one), so it re-prefills: the hit rate falls with no pool overflow and no preemption. Only
    between the levels that straddle the slot count; a drop below it is something else (compute).
    """
    good, bad, slots, pinned = d.good, d.bad, d.slots, d.pinned
    if slots is None or not good.agents <= slots < bad.agents or d.pre_up > 0.5 or d.pool_full:
        return None
    waited = (bad.mean_waiting or 0.0) >= 0.05 or (bad.queue_wait_s.p50 or 0.0) > 0
    parts = []
    if pinned:
        # Pinned, agent i and agent i + slots share slot i: a turn can only wait for its own slot, and what it
        # loses is what the other agent's turn left there in between.
        parts.append(f"agents are pinned to slots (id_slot = agent mod {slots}), so some slots serve two agents")
    if waited:
        parts.append(
            f"turns queue for {'their own' if pinned else 'a'} slot ({bad.mean_waiting or 0:.2f} requests "
            f"waiting on average, the server's deferred-request gauge on llama.cpp, {bad.mean_running or 0:.1f} "
            "running)"
        )
    if pinned and d.hit_fell:
        parts.append(
            f"a turn then finds the other agent's prompt in its slot and re-prefills its context: the per-slot "
            f"prompt-cache hit rate falls from {d.h_good:.1%} to {d.h_bad:.1%}"
        )
    elif d.hit_fell:
        parts.append(
            f"a turn takes whichever slot is idle, whose cache holds another agent's prompt, so the per-slot "
            f"prompt-cache hit rate falls from {d.h_good:.1%} to {d.h_bad:.1%} and the turn re-prefills its context"
        )
    if not parts:
        parts.append("every slot is busy")
    return (
        f"past {good.agents} agents there are more agents than the server's {slots} slots: "
        + "; ".join(parts)
        + (
            f"; no shared pool overflows (peak KV {bad.peak_kv_usage:.0%}, no preemption)"
            if bad.peak_kv_usage is not None
            else "; each slot holds its own context, so no shared pool overflows (the server reports no KV gauge)"
        )
    )


def _cache_eviction(d: _Drop) -> str | None:
    """The prefix-cache hit rate fell far enough that prefill recomputes what the cache used to serve."""
    if not (
        d.hit_drop >= 0.10
        or (d.hit_drop >= 0.01 and d.miss_ratio >= 1.5 and d.pool_full)
        # Misses at least doubled over a fall of 5 points is the pool's cliff even where the sampled KV peak reads
        # below full (one sample a second misses the moment it filled: a real vLLM past its pool by one agent read
        # 77 % at its peak while its hit rate fell from 96.6 % to 87.5 %).
        or (d.hit_drop >= 0.05 and d.miss_ratio >= 2.0)
    ):
        return None
    good, bad, slots = d.good, d.bad, d.slots
    if slots is not None and bad.agents <= slots and d.pinned:
        # Pinned below the slot count every agent has a slot of its own: the loss is not slot sharing.
        summary = (
            f"past {good.agents} agents, within the server's {slots} slots and each agent pinned to its own "
            f"(id_slot), the per-slot prompt-cache hit rate still falls from {d.h_good:.1%} to {d.h_bad:.1%} "
            f"({d.miss_ratio:.1f}× the share of prompt tokens missed): not slots taken by other agents, but turns "
            "whose prompt no longer starts with what their slot holds (a new session, or a context cut to fit)"
        )
    elif slots is not None and bad.agents <= slots:
        # Below the slot count a slot server has no shared pool to outgrow: its cache loss is agents taking
        # each other's slots (llama.cpp gives a turn the idle slot most like its prompt, a shared system prompt
        # included, before an empty one).
        summary = (
            f"past {good.agents} agents, still within the server's {slots} slots, turns take each other's slots: "
            f"the per-slot prompt-cache hit rate falls from {d.h_good:.1%} to {d.h_bad:.1%} ({d.miss_ratio:.1f}× "
            "the share of prompt tokens missed), as a turn is given the idle slot most like its prompt (llama.cpp's "
            "--slot-prompt-similarity; a shared system prompt makes another agent's slot look alike) rather "
            "than an empty one; pinning each agent to its own slot (llama.cpp's id_slot, which bench does unless "
            "--no-pin-slots) avoids it"
        )
    else:
        offload = ""
        if bad.prefix_hit_rate_offload:
            # With a tier below the GPU pool, evicted blocks are loaded back rather than recomputed, until the
            # tier too is outgrown or its link is the bottleneck: the rate named is both tiers'.
            offload = (
                f" (GPU cache and offload tier together; the tier loaded {bad.prefix_hit_rate_offload:.1%} of "
                f"prompt tokens, {bad.offload_loaded_tps or 0:,.0f} tokens/s over its link)"
            )
        summary = (
            f"past {good.agents} agents the live contexts outgrow the KV pool: the prefix-cache hit rate falls "
            f"from {d.h_good:.1%} to {d.h_bad:.1%}{offload} ({d.miss_ratio:.1f}× the share of prompt tokens "
            "missed), so evicted sessions re-prefill their whole context"
        )
    if d.pre_up > 0.5:
        summary += f", and running requests are preempted ({_preemptions_per_min(bad):.1f}/min)"
    return summary


def _preemption(d: _Drop) -> str | None:
    if d.pre_up <= 0.5:
        return None
    return (
        f"past {d.good.agents} agents running requests no longer fit in the KV pool: preemptions rise to "
        f"{_preemptions_per_min(d.bad):.1f}/min and their progress is recomputed"
    )


def _kv_pool_full(d: _Drop) -> str | None:
    """The pool holds every resident context and new turns wait for blocks, while the reuse holds up.

    What an offload tier does (evicted blocks come back over its link instead of being recomputed, but loading
    them makes no room in the GPU pool), or a cache big enough for the idle sessions but not the running.
    """
    good, bad, ev = d.good, d.bad, d.ev
    waiting = bad.mean_waiting or 0.0
    if not (d.pool_full and waiting >= 0.5 and waiting > (good.mean_waiting or 0.0)):
        return None
    summary = (
        f"past {good.agents} agents the KV pool is full (peak {bad.peak_kv_usage or 0:.0%}) and turns queue for "
        f"blocks ({bad.mean_waiting or 0:.1f} waiting on average beside {bad.mean_running or 0:.1f} running), so "
        f"TTFT p50 goes from {ev.get('ttft_p50_s_at_knee', float('nan')):.3g} to "
        f"{ev.get('ttft_p50_s_past_knee', float('nan')):.3g} s"
    )
    if bad.prefix_hit_rate_offload and d.h_bad is not None:
        summary += (
            f"; the offload tier loads {bad.prefix_hit_rate_offload:.1%} of prompt tokens back "
            f"({bad.offload_loaded_tps or 0:,.0f} tokens/s over its link), which keeps the reuse at "
            f"{d.h_bad:.1%} but cannot raise how many contexts the GPU pool holds at once"
        )
    return summary


def _compute_saturation(d: _Drop) -> str:
    """What is left: the server is busy, not short of memory (the step slowed, or it held and turns queue)."""
    # Say what the cache did rather than claim it did nothing: a small fall is named with its figures.
    cache = f"the prefix-hit rate moved only from {d.h_good:.1%} to {d.h_bad:.1%}" if d.hit_fell else "no cache loss"
    itl_at, itl_past = d.ev.get("itl_p50_s_at_knee"), d.ev.get("itl_p50_s_past_knee")
    itl = "" if itl_at is None or itl_past is None else f" (ITL {itl_at * 1e3:.1f} → {itl_past * 1e3:.1f} ms)"
    if itl_at is not None and itl_past is not None and itl_past < itl_at * (1 + STEP_GROWTH):
        # The step did not slow: more agents brought no more work per second, a plateau, not a slowdown.
        return (
            f"past {d.good.agents} agents the server does no more work per second: step time holds{itl}, so the "
            f"extra agents' turns wait their turn, with no preemption; {cache}"
        )
    return f"past {d.good.agents} agents the server is compute-bound: step time grows{itl} with no preemption; {cache}"


# The causes a knee can have, in the order they are tried: the first whose test holds names it (a slot server's
# queue before a fall in reuse, reuse before preemption, a full pool before plain compute).
_CAUSES: tuple[
    tuple[Literal["slots_full", "cache_eviction", "preemption", "kv_pool_full"], Callable[[_Drop], str | None]], ...
] = (
    ("slots_full", _slots_full),
    ("cache_eviction", _cache_eviction),
    ("preemption", _preemption),
    ("kv_pool_full", _kv_pool_full),
)


def explain_knee(
    good: LevelSummary, bad: LevelSummary | None, *, slots: int | None = None, pinned: bool = False
) -> KneeExplanation:
    """Attribute the drop from ``good`` (at the knee) to ``bad`` (just past it), with the numbers.

    ``slots``: the server is slot-based (llama.cpp ``-np``), so a knee where every slot is busy and requests wait
    for one, with the pool not full, is the slots filling up (``slots_full``), not the pool overflowing.
    ``pinned``: each agent's turns named its slot (``id_slot`` = agent mod slots, ``endpoint.pinning``).
    """
    if bad is None:
        return KneeExplanation(cause="none", summary=f"no drop up to {good.agents} agents")
    drop = _Drop.of(good, bad, slots, pinned)
    for cause, test in _CAUSES:
        summary = test(drop)
        if summary is not None:
            return KneeExplanation(cause=cause, summary=summary, evidence=drop.ev)
    return KneeExplanation(cause="compute_saturation", summary=_compute_saturation(drop), evidence=drop.ev)


def matched_sizes(real: LevelSummary) -> tuple[int, int] | None:
    """The mean prompt and reply of an agents' level, in server tokens, for the synthetic arm to send."""
    if real.context_mean is None or real.output_realised_mean is None:
        return None
    prompt = round(real.context_mean - real.output_realised_mean)
    output = round(real.output_realised_mean)
    return (prompt, output) if prompt >= 1 and output >= 1 else None


def compare_arms(real: LevelSummary, synth: LevelSummary) -> list[str]:
    """Why real agents' output throughput differs from a synthetic load of the same request sizes, in sentences.

    The arms differ in three ways a server feels: reuse (an agent resends its conversation, so its prompt is
    mostly cached; a synthetic prompt is new), idle time (an agent thinks and runs tools between turns, so it has
    no request in flight part of the time; the synthetic arm sends back to back), and reply lengths (an agent's
    replies vary with its turns; the matched arm's are their mean).
    """
    out: list[str] = []
    h_real, h_synth = real.prefix_hit_rate_effective, synth.prefix_hit_rate_effective
    if h_real is not None and h_synth is not None:
        c_real = real.prefill_tps * (1.0 - h_real)
        c_synth = synth.prefill_tps * (1.0 - h_synth)
        out.append(
            f"reuse: the prefix cache served {h_real:.1%} of the agents' prompt tokens and {h_synth:.1%} of the "
            f"synthetic arm's, so prefill computed {c_real:,.0f} vs {c_synth:,.0f} tokens/s"
            + (" (the agents' advantage)" if c_synth > c_real else "")
        )
    if real.mean_running is not None and synth.mean_running is not None:
        busy_real, busy_synth = real.mean_running / real.agents, synth.mean_running / synth.agents
        out.append(
            f"idle time: the agents had a request running {busy_real:.0%} of the time on average (think and tool "
            f"time between turns), the synthetic arm {busy_synth:.0%}"
            + (" (the synthetic arm's advantage)" if busy_synth > busy_real + 0.05 else "")
        )
    if real.output_realised_mean is not None and synth.output_realised_mean is not None:
        out.append(
            f"replies: {real.output_realised_mean:,.0f} tokens a turn for the agents, "
            f"{synth.output_realised_mean:,.0f} for the synthetic arm"
        )
    if real.ttft_s.p50 is not None and synth.ttft_s.p50 is not None:
        out.append(f"TTFT p50: {real.ttft_s.p50:.3g} s for the agents, {synth.ttft_s.p50:.3g} s for the synthetic arm")
    return out
