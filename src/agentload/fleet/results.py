"""The result of a run, compiled from the checkpoint log (accumulate, then compile, as guidellm's benchmark schemas do).

The runner only appends to the log while it runs; at the end of a segment ``compile_result`` reads the log back
and builds an immutable ``FleetResult`` that round-trips through ``results.json``. Reports render from that, so
what is printed is what was recorded — including the turns of earlier, killed segments.
"""

from __future__ import annotations

import statistics as stats
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentload.fleet.checkpoint import LogState, RunManifest
from agentload.fleet.config import AgentPlan
from agentload.fleet.limiter import LimitChange, LimiterStatistics, Mode, time_weighted_limit
from agentload.store.manifest import RunInfo

# An agent without an ``agent`` line has not ended: "interrupted" if it had begun (committed turns, or a turn the
# server failed), else "unstarted". Both are resumable; only done / failed / skipped are final.
AgentOutcome = Literal["done", "failed", "skipped", "interrupted", "unstarted"]


class AgentResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    agent_id: str
    task_id: str
    wave: int
    outcome: AgentOutcome
    stop_reason: str = ""
    detail: str = ""
    turns: int
    attempts: int  # requests sent for the committed turns, retries included
    interrupted_attempts: int = 0  # requests of turns the server failed (logged, not committed; sent again)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    wall_s: float  # from the agent's start to its end (or its last committed turn), over every segment
    ttft_p50_s: float | None
    segments: list[int] = Field(description="segments that committed its turns (more than one: it was resumed)")
    last_output: str = ""
    tool_calls: int = Field(default=0, description="tool calls in its committed turns (what the agent did)")


class SegmentResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    segment: int
    mode: Mode
    start_width: int
    reason: str
    turns: int
    wall_s: float | None = Field(default=None, description="None for a segment that was killed")
    limit_history: list[LimitChange] = Field(default_factory=list)


class FleetTotals(BaseModel):
    model_config = ConfigDict(frozen=True)

    agents: int
    done: int
    failed: int
    skipped: int
    unfinished: int  # interrupted + unstarted: what a resume would run
    interrupted: int = 0
    unstarted: int = 0
    turns: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class FleetResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    format: Literal[1] = 1
    run_id: str
    fleet: str
    server: str
    model: str
    mode: Mode
    start_width: int
    start_reason: str
    warnings: list[str] = Field(default_factory=list)
    wall_s: float = Field(description="this segment's wall clock")
    turns_per_s: float = Field(description="turns committed in this segment per second of it")
    settled_width: float = Field(description="time-weighted mean width over the second half of this segment")
    stopped_early: bool = False
    server_failure: str | None = Field(
        default=None, description="the server-level failure that stopped this segment; the result is incomplete"
    )
    executor: str = Field(default="local", description="who sent this segment's requests (--executor)")
    totals: FleetTotals
    limiter: LimiterStatistics
    segments: list[SegmentResult]
    agents: list[AgentResult]


def _agent_result(plan: AgentPlan, state: LogState) -> AgentResult:
    lines = state.turns.get(plan.agent_id, [])
    records = [r for line in lines for r in line.turn.records]
    finals = [line.turn.final for line in lines]
    ttfts = [t for r in finals[1:] if (t := r.ttft) is not None]  # later turns: the first is a cold prefill
    done = state.finished.get(plan.agent_id)
    interrupts = state.interrupts.get(plan.agent_id, [])
    begun: AgentOutcome = "interrupted" if lines or interrupts else "unstarted"
    outcome: AgentOutcome = done.outcome if done is not None else begun
    last = next((r.content for r in reversed(finals) if r.content), "")
    if done is not None and done.final_content:
        last = done.final_content
    return AgentResult(
        agent_id=plan.agent_id,
        task_id=plan.task_id,
        wave=plan.wave,
        outcome=outcome,
        stop_reason=done.stop_reason if done is not None else "",
        detail=done.detail if done is not None else (interrupts[-1].detail if interrupts else ""),
        turns=len(lines),
        attempts=len(records),
        interrupted_attempts=sum(len(x.records) for x in interrupts),
        prompt_tokens=sum(r.prompt_tokens for r in finals),
        completion_tokens=sum(r.completion_tokens for r in finals),
        cached_tokens=sum(r.cached_tokens or 0 for r in finals),
        wall_s=done.elapsed_s if done is not None else state.elapsed(plan.agent_id),
        ttft_p50_s=stats.median(ttfts) if ttfts else None,
        segments=sorted({line.segment for line in lines}),
        last_output=last[:200],
        tool_calls=sum(len(r.tool_calls) for r in finals),
    )


def compile_result(
    manifest: RunManifest,
    plans: list[AgentPlan],
    state: LogState,
    *,
    server: str,
    model: str,
    segment: int,
    wall_s: float,
    limiter: LimiterStatistics,
    warnings: list[str],
    stopped_early: bool,
    server_failure: str | None = None,
    executor: str = "local",
) -> FleetResult:
    agents = [_agent_result(p, state) for p in plans]
    seg_results: list[SegmentResult] = []
    for seg in state.segments:
        seg_results.append(
            SegmentResult(
                segment=seg.segment,
                mode=seg.mode,
                start_width=seg.start_width,
                reason=seg.reason,
                turns=sum(1 for lines in state.turns.values() for t in lines if t.segment == seg.segment),
                wall_s=wall_s if seg.segment == segment else None,
                limit_history=[x.change for x in state.limits if x.segment == seg.segment],
            )
        )
    this = next(s for s in seg_results if s.segment == segment)
    outcomes = [a.outcome for a in agents]
    settled = (
        time_weighted_limit(limiter.history, this.start_width, wall_s / 2, wall_s) if wall_s > 0 else this.start_width
    )
    return FleetResult(
        run_id=manifest.run_id,
        fleet=manifest.fleet.name,
        server=server,
        model=model,
        mode=this.mode,
        start_width=this.start_width,
        start_reason=this.reason,
        warnings=warnings,
        wall_s=wall_s,
        turns_per_s=this.turns / wall_s if wall_s > 0 else 0.0,
        settled_width=settled,
        stopped_early=stopped_early,
        server_failure=server_failure,
        executor=executor,
        totals=FleetTotals(
            agents=len(agents),
            done=outcomes.count("done"),
            failed=outcomes.count("failed"),
            skipped=outcomes.count("skipped"),
            unfinished=outcomes.count("interrupted") + outcomes.count("unstarted"),
            interrupted=outcomes.count("interrupted"),
            unstarted=outcomes.count("unstarted"),
            turns=sum(a.turns for a in agents),
            prompt_tokens=sum(a.prompt_tokens for a in agents),
            completion_tokens=sum(a.completion_tokens for a in agents),
            cached_tokens=sum(a.cached_tokens for a in agents),
        ),
        limiter=limiter,
        segments=seg_results,
        agents=agents,
    )


def fleet_info(result: FleetResult, *, created: str) -> RunInfo:
    """The run's manifest after a segment: finished once no agent is left to run, else interrupted (resumable).

    Output tok/s is given for a run of one segment only: the tokens are totals over every segment, the wall clock
    is this segment's, and their ratio would overstate a resumed run.
    """
    t = result.totals
    if result.server_failure is not None:
        status, detail = "interrupted", f"the server failed: {result.server_failure}"
    elif t.unfinished:
        status = "interrupted"
        detail = f"{t.unfinished} agents left to resume" + (" (stopped early)" if result.stopped_early else "")
    else:
        status, detail = "finished", ""
    single = len(result.segments) == 1 and result.wall_s > 0
    return RunInfo(
        kind="fleet",
        run_id=result.run_id,
        created=created,
        status=status,
        detail=detail,
        target=result.server,
        model=result.model,
        workload=result.fleet,
        mode=result.mode.value,
        levels=len(result.segments),
        best_output_tps=t.completion_tokens / result.wall_s if single else None,
        outcome=f"{t.done}/{t.agents} done, {t.failed} failed, {t.turns:,} turns, width {result.settled_width:.1f}",
    )
