"""The predicted throughput curve: the simulator in virtual time on a plan's profile, and the knee it shows.

``add_throughput_curve`` runs ``agentload.sim.virtual.run_sessions`` on ``planner.planned_profile(plan)`` — the
same profile the static figures came from — at a handful of agent counts around the estimate (and around the
GPU + offload capacity when there is an offload tier), with virtual durations sized from the step-time model.
Each run accumulates into a ``CurvePoint``; the points are compiled into an immutable ``ThroughputCurve`` at the
end, so the knee is computed from data, never from live simulator state.

The knee is judged by the same rule as bench's (``capacity.knee``: turns/s or tok/s falls, the prefix-hit rate
collapses, or TTFT jumps, against the smaller counts) — past it, sessions' prefixes are evicted while their agents
think, and every turn re-prefills the whole conversation (docs/background.md §1). A cliff seen between two grid
counts is bisected to one agent.

It lives beside the simulator it drives, not in ``capacity``: the simulator imports capacity's KV and step-time
model, so a curve in ``capacity`` made the two packages import each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

from agentload.agent.shape import TURN_OVERHEAD_TOKENS, AgenticShape
from agentload.capacity.knee import KNEE_TOLERANCE, RULE_TEXT, LevelSignals, judge_all
from agentload.capacity.planner import AgentShape, CurvePoint, Plan, ThroughputCurve, planned_profile
from agentload.capacity.profile import ServingProfile
from agentload.errors import ConfigError
from agentload.sim.engine import StepResult
from agentload.sim.virtual import SessionShape, run_sessions

KNEE_DROP = KNEE_TOLERANCE  # the rule's throughput tolerance (kept under this name for the plan's JSON readers)
# Agent counts tried around the estimate, as fractions of it; a cliff between two of them is then bisected.
CURVE_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5)
# Simulating more sessions than this takes minutes; the curve stops there and says so.
MAX_SIMULATED_AGENTS = 512


class CurveProgress(Protocol):
    """What the curve reports while it runs (the CLI draws a progress bar from it)."""

    def run_started(self, agents: int, duration_s: float, runs_planned: int) -> None: ...

    def advanced(self, virtual_s: float) -> None: ...

    def run_finished(self, point: CurvePoint) -> None: ...


def curve_counts(estimate: float, shared_prefix: float | None = None, offload_sessions: float = 0.0) -> list[int]:
    """The agent counts tried first: fractions of the estimate, distinct, at least one.

    Two things move the cliff away from the dense estimate, so counts around where they put it are tried too
    (when that is more than 10% away): agents that share a system prompt store it once (``shared_prefix``
    sessions fit), and an offload tier adds its sessions (below GPU + CPU capacity, evicted prefixes come back
    at link speed instead of being recomputed).
    """
    counts = {max(1, round(estimate * f)) for f in CURVE_FRACTIONS}
    centres = [estimate + offload_sessions] if offload_sessions > 0 else []
    if shared_prefix is not None:
        centres.append(shared_prefix + offload_sessions)
    for centre in centres:
        if abs(centre / estimate - 1) > 0.10:
            counts |= {max(1, round(centre * f)) for f in CURVE_FRACTIONS if 0.9 <= f <= 1.25}
    return sorted(counts)


def run_durations(profile: ServingProfile, agents: int, context: int, shape: AgentShape) -> tuple[float, float]:
    """(duration, warm-up) in virtual seconds, long enough for the first burst of prefills and ~8 turns each.

    A turn takes think time + API overhead + the reply at the decode step time of this batch; the warm-up covers
    every agent's first full prefill plus two turns, so the window sees the steady state.
    """
    sm = profile.step_model
    batch = min(agents, profile.max_num_seqs)
    turn_s = (
        shape.think_s
        + profile.coefficients.api_overhead_s
        + shape.output_tokens * sm.decode_step_time(batch, context)
        + sm.chunked_prefill_time(shape.turn_input_tokens + shape.output_tokens, profile.max_num_batched_tokens)
    )
    burst_s = agents * sm.chunked_prefill_time(context, profile.max_num_batched_tokens)
    warmup = burst_s + 2 * turn_s
    return warmup + max(8 * turn_s, 30.0), warmup


def held_agent(context: int, agent: AgentShape) -> AgenticShape:
    """The plan's agent as bench's ``agentic-hold`` shape: held at ``context`` (its prompt plus a reply of twice
    the mean peak there), every turn the plan's sizes exactly, the plan's think time between turns."""
    return AgenticShape.published(context, "hold", **held_agent_options(context, agent))


def held_agent_options(context: int, agent: AgentShape) -> dict[str, Any]:
    """The ``agentic-hold`` options (``workload.agentic.SHAPE_OPTIONS``) of ``held_agent``: with them bench runs the
    very workload the plan's curve simulates (``benchmarks/plan_vs_bench.py`` compares the two knees).

    The plan's turn input counts the chat template's tokens between turns; the shape's tool result does not.
    """
    tool = agent.turn_input_tokens - TURN_OVERHEAD_TOKENS
    opening = context - 2 * agent.output_tokens - agent.turn_input_tokens
    if tool < 1 or opening <= agent.system_tokens:
        raise ConfigError(
            f"a context of {context} leaves no room for a {agent.system_tokens}-token system prompt and a turn of "
            f"{agent.turn_input_tokens} input and {agent.output_tokens} output tokens"
        )
    return {
        "start_tokens": opening,  # a held session's first prompt is its whole opening
        "system_tokens": agent.system_tokens,
        "output_tokens": agent.output_tokens,
        "tool_result_tokens": tool,
        "tool_latency_s": 0.0,
        "think_s": agent.think_s,
        "output_sigma": 0.0,
        "tool_result_sigma": 0.0,
        "think_sigma": 0.0,
    }


def _signals(p: CurvePoint, offload: bool) -> LevelSignals:
    window = max(p.duration_s - p.warmup_s, 1e-9)
    return LevelSignals(
        agents=p.agents,
        output_tps=p.output_tps,
        turns_per_s=p.turns / window,
        ttft_p50_s=p.ttft_p50_s,
        # The point's hit rate counts GPU hits only; with a CPU tier an evicted prefix comes back at link speed
        # instead of being recomputed, so a falling GPU hit rate does not by itself mean the cliff.
        hit_rate=None if offload else p.prefix_hit_rate,
    )


def _past_knee(points: dict[int, CurvePoint], agents: int, offload: bool = False) -> bool:
    """True when the knee rule puts ``agents`` past the knee, judged against the smaller counts."""
    return judge_all([_signals(p, offload) for p in points.values()], KNEE_DROP)[agents].past


def add_throughput_curve(
    plan_: Plan,
    *,
    progress: CurveProgress | None = None,
    counts: list[int] | None = None,
    refine: bool = True,
) -> Plan:
    """``plan_`` with a simulated throughput curve and its knee (see ``knee_rule`` in the result)."""
    runs = _CurveRuns(plan_, progress)
    offload = plan_.offload.extra_sessions if plan_.offload is not None else 0.0
    has_offload = plan_.offload is not None
    a = plan_.agents
    wanted = counts if counts is not None else curve_counts(a.estimate, a.shared_prefix_sessions, offload)
    capped = max(wanted) > MAX_SIMULATED_AGENTS
    todo = sorted({min(n, MAX_SIMULATED_AGENTS) for n in wanted})
    runs.planned = len(todo)
    for n in todo:
        runs.run(n)
    points = runs.points
    knee, past = _find_cliff(points, has_offload)
    if knee is None and counts is None and max(points) < MAX_SIMULATED_AGENTS:
        # No fall within the grid: one look at twice the largest count before calling the curve knee-less.
        runs.planned += 1
        runs.run(min(2 * max(points), MAX_SIMULATED_AGENTS))
        knee, past = _find_cliff(points, has_offload)
    if refine:
        knee, past = _bisect_cliff(runs, knee, past, has_offload)
    rule = f"{RULE_TEXT} (tolerance {KNEE_DROP:.0%}), bisected to one agent"
    return plan_.model_copy(
        update={
            "curve": ThroughputCurve(
                points=tuple(points[n] for n in sorted(points)),
                knee=knee,
                first_past_knee=past,
                estimate=plan_.agents.estimate + offload,
                knee_rule=rule,
                capped_at=MAX_SIMULATED_AGENTS if capped else None,
            )
        }
    )


class _CurveRuns:
    """The simulated points of one plan's curve, one virtual run per agent count, on the plan's own profile.

    ``planned`` is how many runs the progress display is told to expect; it grows as the knee search adds runs.
    """

    def __init__(self, plan_: Plan, progress: CurveProgress | None) -> None:
        self.profile = planned_profile(plan_)
        self.context = plan_.agents.context
        self.agent = plan_.spec.agent
        self.shape = SessionShape.from_agentic(held_agent(self.context, self.agent))
        self.progress = progress
        self.planned = 0
        self.points: dict[int, CurvePoint] = {}

    def run(self, agents: int, *, refinement: bool = False) -> None:
        """Simulate ``agents`` sessions and keep their point (a count run again replaces its point)."""
        progress = self.progress
        duration, warmup = run_durations(self.profile, agents, self.context, self.agent)
        if progress is not None:
            progress.run_started(agents, duration, self.planned)
        tick: Callable[[StepResult], None] | None = None
        if progress is not None:
            tick = _throttled(progress, duration)
        res = run_sessions(self.profile, agents, self.shape, duration_s=duration, warmup_s=warmup, on_step=tick)
        point = CurvePoint(
            agents=agents,
            output_tps=res.output_tps,
            prefill_tps=res.prefill_tps,
            prefix_hit_rate=res.prefix_hit_rate,
            recomputed_tokens=res.recomputed_tokens,
            preemptions=res.preemptions,
            mean_kv_usage=res.mean_kv_usage,
            mean_running=res.mean_running,
            mean_waiting=res.mean_waiting,
            ttft_p50_s=res.ttft_percentile(50) if res.ttft_s else None,
            turns=res.turns_completed,
            duration_s=duration,
            warmup_s=warmup,
            refinement=refinement,
        )
        self.points[agents] = point
        if progress is not None:
            progress.run_finished(point)


def _bisect_cliff(
    runs: _CurveRuns, knee: int | None, past: int | None, has_offload: bool
) -> tuple[int | None, int | None]:
    """The cliff between ``knee`` and ``past`` bisected to one agent (2% for large counts), with the runs it took.

    The rule compares a count with the largest good one below it, so a count added by bisection can change the
    verdict on a larger one (a TTFT jump measured from 10 agents may not be one from 11): the cliff is judged
    again over every point and bisected again where it moved, a few rounds at most.
    """
    points = runs.points
    for _ in range(3):
        if knee is None or past is None:
            break
        lo, hi = knee, past
        while hi - lo > max(1, round(0.02 * lo)):
            mid = (lo + hi) // 2
            runs.planned += 1
            runs.run(mid, refinement=True)
            if _past_knee(points, mid, has_offload):
                hi = mid
            else:
                lo = mid
        knee, past = _find_cliff(points, has_offload)
        if (knee, past) == (lo, hi):
            break
    return knee, past


def _throttled(progress: CurveProgress, duration: float) -> Callable[[StepResult], None]:
    """An ``on_step`` hook that reports virtual time once per 1% of the run (every step would cost more)."""
    last = [0.0]

    def tick(res: StepResult) -> None:
        if res.end - last[0] >= duration / 100:
            last[0] = res.end
            progress.advanced(min(res.end, duration))

    return tick


def _find_cliff(points: dict[int, CurvePoint], offload: bool = False) -> tuple[int | None, int | None]:
    """(last count before the first fall, first fallen count); (None, None) when throughput never fell."""
    ordered = sorted(points)
    for prev, n in itertools.pairwise(ordered):
        if _past_knee(points, n, offload):
            return prev, n
    return None, None
