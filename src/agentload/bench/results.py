"""The benchmark's results: compiled once, at the end of a level and of a run, from records and server samples.

Everything here is immutable and round-trips through JSON (``RunResult.model_validate_json``); reports render
from the saved file, never from live state.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RESULT_SCHEMA = 1


class Percentiles(BaseModel):
    model_config = ConfigDict(frozen=True)

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class LevelSummary(BaseModel):
    """One load level (a number of concurrent agents at one context size)."""

    model_config = ConfigDict(frozen=True)

    level: int
    agents: int
    context: int
    workload: str
    window_s: float  # measured span (warm-up excluded)
    warmup_s: float
    sessions_completed: int
    sessions_failed: int
    requests_ok: int
    requests_failed: int
    requests_cut: int = 0  # in the window, cut by the level when its grace ran out (not the server's failures)
    turns: int
    pass_rate: float | None = None  # scored workloads (suite)
    output_tps: float
    prefill_tps: float
    throughput_source: Literal["server", "usage"]
    prefill_share: float | None = None  # prompt ÷ (prompt + generated) tokens, cached prompt tokens included
    # The splits a server's work has: prompt tokens it computed (not served from any cache) ÷ those plus the
    # tokens it generated, and the seconds requests spent in prefill ÷ in prefill and decode (its histograms).
    computed_prefill_share: float | None = None
    prefill_time_share: float | None = None
    prefix_hit_rate_server: float | None = None  # the GPU prefix cache's (vLLM's prefix_cache_hits ÷ queries)
    prefix_hit_rate_usage: float | None = None
    # A replayed trace's own ceiling for the same requests: what an unlimited prefix cache would have served of
    # them, in the trace's blocks (``workload.conversation_trace.prefix_ceiling``); None for other workloads.
    prefix_hit_ceiling: float | None = None
    # A replayed trace's pace over the window's turns that followed a reply in their context
    # (``workload.conversation_trace.pace_truth``): the mean recorded think time times the replay's time scale,
    # the mean wait the turns really had (send − previous reply's end), and how late each turn started against its
    # schedule (previous reply's end + recorded wait), p50 and p99. None for other workloads and for runs saved
    # before these were measured.
    think_recorded_s: float | None = None
    think_realised_s: float | None = None
    turn_late_p50_s: float | None = None
    turn_late_p99_s: float | None = None
    # A replayed trace's turns and sessions (``bench.analysis``): each window turn's time from its request's send
    # (its first attempt's) to its reply's end, p50 and p95; the turns among those the pace judges that started
    # more than ``TURN_STALL_S`` late; and each session (a conversation or a subagent) whose last request was the
    # window's, its wall time (first request sent → last reply done) ÷ the trace's recorded one for the same
    # requests (recorded waits + recorded response times, ``workload.conversation_trace.session_walls``), p50 and
    # over how many. None for other workloads, for traces with no sessions or no recorded response times (the
    # ratio), and for runs saved before these were measured.
    turn_latency_p50_s: float | None = None
    turn_latency_p95_s: float | None = None
    turn_stalls: int | None = None
    session_wall_ratio_p50: float | None = None
    sessions_timed: int | None = None
    # Prompt tokens loaded from a KV connector's tier (CPU offload, LMCache) ÷ prompt tokens, and per second.
    prefix_hit_rate_offload: float | None = None
    offload_loaded_tps: float | None = None
    ttft_s: Percentiles = Field(default_factory=Percentiles)
    itl_s: Percentiles = Field(default_factory=Percentiles)
    queue_wait_s: Percentiles = Field(default_factory=Percentiles)
    peak_kv_usage: float | None = None
    mean_kv_usage: float | None = None
    mean_running: float | None = None
    mean_waiting: float | None = None
    preemptions: float | None = None
    recomputed_tokens: float | None = None
    # Work measured: completed agent-turns per second of window, and how many turns the level wanted (a
    # level measures until it has enough turns, the window being the cap; ``too_few_turns`` when it did not).
    turns_per_s: float | None = None
    min_turns: int | None = None
    too_few_turns: bool = False
    # The context the server counted (its usage: prompt + completion tokens of each completed turn), beside the
    # target ``context``; ``None`` when the server sent no usage.
    context_mean: float | None = None
    context_p95: float | None = None
    # Output length: what the workload asked for (max_tokens) vs what came back, per completed turn, and whether
    # exact lengths were requested from the engine (ignore_eos / min_tokens). ``output_short``: realised under
    # ``OUTPUT_SHORT_RATIO`` of requested, so output tok/s does not measure the workload's shape.
    output_requested_mean: float | None = None
    output_realised_mean: float | None = None
    output_controlled: bool = False
    output_short: bool = False
    # What the workload drew for the same turns, before held sessions shortened long draws to stay at their
    # context; ``output_clamped``: requested under ``OUTPUT_CLAMPED_RATIO`` of drawn (levels then asked unalike).
    output_drawn_mean: float | None = None
    output_clamped: bool = False
    warnings: list[str] = Field(default_factory=list)  # sentences a person should read beside this level's row

    @property
    def prefix_hit_rate_effective(self) -> float | None:
        """The share of prompt tokens not recomputed: the GPU cache's hits and an offload tier's loads together
        (the usage side's when the server keeps no counters)."""
        server = self.prefix_hit_rate_server
        if server is None:
            return self.prefix_hit_rate_usage
        return server + (self.prefix_hit_rate_offload or 0.0)

    @property
    def output_ratio(self) -> float | None:
        if not self.output_requested_mean or self.output_realised_mean is None:
            return None
        return self.output_realised_mean / self.output_requested_mean


# A replayed turn that started more than this many seconds after its schedule (previous reply's end + recorded
# wait × time scale) is a stall: longer than the one-second think times Claude Code traces record between tool
# calls, so a replay with stalls did not keep the trace's tightest pace.
TURN_STALL_S = 1.0
# A level whose replies average under this share of the requested length is flagged.
OUTPUT_SHORT_RATIO = 0.8
# A level whose turns asked for under this share of the lengths the workload drew is flagged, and its output tok/s
# is not compared with other levels' by the knee rule (their asks differ, so their tok/s do).
OUTPUT_CLAMPED_RATIO = 0.95


class CapacityEstimate(BaseModel):
    """KV pool ÷ context per session — exact for dense attention, a lower bound for sliding / sparse models."""

    model_config = ConfigDict(frozen=True)

    pool_tokens: int | None
    block_size: int | None
    context: int
    sessions: float | None  # the estimate
    source: str  # where the pool came from (cache_config_info, profile, startup log, ...)
    # The context the estimate divides by: the realised one (server tokens) when the run measured it, else the
    # target; ``target_context`` keeps what was asked for.
    target_context: int | None = None
    # Agents that share a system prompt store its full blocks once (prefix caching): (pool − shared) ÷ (context −
    # shared) sessions fit. The prediction a measured knee is compared with when the workload shares a prefix.
    shared_prefix_tokens: int | None = None
    sessions_shared_prefix: float | None = None
    # A slot-based server (llama.cpp -np N) runs at most this many requests at once, however large its pool: the
    # prediction is the smaller of the two.
    slots: int | None = None
    # The workload replays a trace: its sessions are the sizes it recorded, so ``context`` is the one the server
    # counted and ``target_context`` (``--context``) sized nothing.
    replay: bool = False

    @property
    def predicted(self) -> float | None:
        pool = self.sessions_shared_prefix if self.sessions_shared_prefix is not None else self.sessions
        if self.slots is None or pool is None:
            return pool
        return min(pool, float(self.slots))

    label: str = "dense-attention estimate; a lower bound for sliding-window / sparse attention"


class KneeExplanation(BaseModel):
    model_config = ConfigDict(frozen=True)

    cause: Literal["preemption", "cache_eviction", "kv_pool_full", "slots_full", "compute_saturation", "slo", "none"]
    summary: str  # one sentence a person can read
    evidence: dict[str, float] = Field(default_factory=dict)  # the numbers behind it, before vs at the knee


# What the measured levels bound of a knee (``bench.search.bounds``):
# - "bracketed": a level at the knee and one just past it (at most half as many agents again, or one more);
# - "between": a level at the knee and one past it, with a gap between them nothing measured: the knee lies in it;
# - "below": the level past it is measured, but the level before it is the smallest measured and has nothing
#   smaller to be judged against: the knee is somewhere under the level past it;
# - "at_least": no level was past the knee: it is at or above the largest level measured;
# - "unjudged": no level was past it and the only levels measured have no smaller one to be judged against;
# - "unmeasured": the level it would rest on completed no turn, so no knee is claimed.
KneeBound = Literal["bracketed", "between", "below", "at_least", "unjudged", "unmeasured"]


class Knee(BaseModel):
    model_config = ConfigDict(frozen=True)

    agents: int  # the last level before the drop (or the largest meeting the SLO)
    context: int
    criterion: str  # e.g. "throughput peak" or "ttft_p95 <= 2s"
    # Measured ÷ predicted capacity, only where the measured levels bracket the knee; elsewhere the bound the
    # levels allow (``ratio_low`` ≤ the ratio ≤ ``ratio_high``, either open) and ``ratio_note`` says why.
    measured_over_predicted: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    ratio_note: str = ""
    bound: KneeBound = "bracketed"
    past_at: int | None = None  # the smallest measured level past the knee (``None``: none was)
    explanation: KneeExplanation
    agent_turns: int = 0  # the work the search spent
    decided_by: str = ""  # the signal that put the level after the knee past it (bench/knee rule), e.g. "ttft"
    # A replayed trace's context as the server counted it (the capacity estimate's divisor), said in place of
    # ``context``, the ``--context`` the trace's recorded sizes ignore; None for other workloads.
    realised_context: int | None = None

    @property
    def where(self) -> str:
        """Where the measured levels put the knee: "24", "16–63", "< 128", "≥ 48", or "—" when nothing does."""
        if self.bound == "between" and self.past_at is not None:
            return f"{self.agents}–{self.past_at - 1}"
        if self.bound == "below" and self.past_at is not None:
            return f"< {self.past_at}"
        if self.bound == "at_least":
            return f"≥ {self.agents}"
        if self.bound in ("unmeasured", "unjudged"):
            return "—"
        return str(self.agents)


class RunResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: int = RESULT_SCHEMA
    run_id: str
    created: str  # ISO-8601 wall-clock date of the start
    agentload_version: str
    target: str  # URL, or "sim:PROFILE (in-process, virtual time)"
    model: str
    workload: str
    mode: Literal["sweep", "find-knee", "grid", "soak", "single"]
    settings: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    levels: list[LevelSummary]
    capacity: list[CapacityEstimate] = Field(default_factory=list)
    knee: list[Knee] = Field(default_factory=list)
    real_over_synthetic: float | None = None
    # The matched synthetic arm (``--compare-synthetic``): its level, apart from the agents' levels, and the
    # causes of the ratio in sentences (reuse, idle time, reply lengths).
    synthetic: list[LevelSummary] = Field(default_factory=list)
    synthetic_why: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    # Set (to why) when the run stopped before its plan was done — the server was lost mid-run: the
    # levels are those measured until then, and no knee or capacity is claimed for the context it stopped in.
    incomplete: str | None = None
