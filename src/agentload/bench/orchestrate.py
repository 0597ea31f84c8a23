"""A whole benchmark: which levels to run (sweep, knee search, context grid, soak), each on a fresh target for the
simulator, compiled into one RunResult with capacity estimates and the explained knee.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from agentload import __version__
from agentload.bench.analysis import LevelData, summarise
from agentload.bench.results import CapacityEstimate, Knee, LevelSummary, RunResult
from agentload.bench.runner import RecordSink, run_level
from agentload.bench.search import Search, Slo, find_knee, sweep
from agentload.bench.soak import GpuMonitor, drift_notes
from agentload.bench.target import Target
from agentload.vtime import LoopClock
from agentload.workload.base import Workload

Mode = Literal["sweep", "find-knee", "grid", "soak", "single"]
LevelHook = Callable[[LevelSummary], None]


@dataclass
class BenchPlan:
    make_target: Callable[[], Target]  # a fresh simulated server per level; the same real server every time
    workload: Workload
    contexts: list[int]
    mode: Mode
    agents: list[int] = field(default_factory=list)  # sweep / single / soak
    warmup_s: float = 120.0
    window_s: float = 300.0
    # Knee-search probes only need to tell "before the cliff" from "past it", which a KV cliff makes stark, so
    # they run shorter than sweep levels (an eighth of the window, half the warm-up by default): that is how a
    # search costs a fraction of a sweep's agent-turns.
    probe_scale: float = 0.12
    slo: Slo | None = None
    tolerance: float = 0.10
    max_agents: int = 1024
    synthetic: Workload | None = None  # the matched arm, run at the knee (or the last level) for the ratio
    seed: int = 0
    settings: dict[str, str | int | float | bool | None] = field(default_factory=dict)


def capacity_for(target: Target, context: int, pool: tuple[int, int, str] | None) -> CapacityEstimate:
    """Pool ÷ context per session, in whole blocks as vLLM counts them."""
    if target.profile is not None:
        p = target.profile
        return CapacityEstimate(
            pool_tokens=p.pool_tokens,
            block_size=p.block_size,
            context=context,
            sessions=p.layout.naive_sessions(p.num_blocks, context),
            source=f"simulator profile {p.name} ({p.pool_source})",
        )
    if pool is None:
        return CapacityEstimate(pool_tokens=None, block_size=None, context=context, sessions=None,
                                source="the server does not report its KV pool")  # fmt: skip
    tokens, block, source = pool
    sessions = (tokens // block) / -(-context // block)
    return CapacityEstimate(pool_tokens=tokens, block_size=block, context=context, sessions=sessions, source=source)


async def run_bench(
    plan: BenchPlan,
    *,
    pool: tuple[int, int, str] | None = None,
    on_level: LevelHook | None = None,
    sink: RecordSink | None = None,
    run_id: str | None = None,
) -> tuple[RunResult, list[LevelData]]:
    run_id = run_id or datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    created = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = LoopClock().now()
    all_data: list[LevelData] = []
    levels: list[LevelSummary] = []
    knees: list[Knee] = []
    capacity: list[CapacityEstimate] = []
    notes: list[str] = []
    description = ""
    model = ""

    async def measure_with(workload: Workload, agents: int, context: int, scale: float = 1.0) -> LevelSummary:
        nonlocal description, model
        target = plan.make_target()
        description, model = target.description, target.model
        try:
            data = await run_level(
                target,
                workload,
                agents=agents,
                context=context,
                level=len(all_data),
                run_id=run_id,
                run_t0=t0,
                warmup_s=plan.warmup_s * (0.5 if scale < 1.0 else 1.0),
                window_s=plan.window_s * scale,
                seed=plan.seed,
                sink=sink,
            )
        finally:
            if target.virtual:
                await target.transport.aclose()
        all_data.append(data)
        summary = summarise(data)
        levels.append(summary)
        if on_level is not None:
            on_level(summary)
        return summary

    probe_target = plan.make_target()
    for context in plan.contexts:
        estimate = capacity_for(probe_target, context, pool)
        capacity.append(estimate)

        scale = plan.probe_scale if plan.mode == "find-knee" else 1.0

        async def measure(agents: int, context: int = context, scale: float = scale) -> LevelSummary:
            return await measure_with(plan.workload, agents, context, scale)

        search = Search(measure, tolerance=plan.tolerance, slo=plan.slo)
        if plan.mode == "find-knee":
            knee = await find_knee(search, context, max_agents=plan.max_agents)
        elif plan.mode in ("sweep", "grid"):
            knee = await sweep(search, plan.agents, context)
        elif plan.mode == "soak":
            gpus = GpuMonitor()
            gpus.start()
            for n in plan.agents:
                await measure(n)
                notes.extend(drift_notes(all_data[-1]))
            notes.extend(await gpus.stop())
            continue
        else:  # single: the levels are measured, no knee is claimed
            for n in plan.agents:
                await measure(n)
            continue
        if estimate.sessions:
            knee = knee.model_copy(update={"measured_over_predicted": knee.agents / estimate.sessions})
        knees.append(knee)
    if probe_target.virtual:
        await probe_target.transport.aclose()

    ratio = None
    if plan.synthetic is not None and levels:
        at = knees[0].agents if knees and knees[0].agents > 0 else levels[-1].agents
        real = next((s for s in levels if s.agents == at and s.context == plan.contexts[0]), levels[-1])
        synth = await measure_with(plan.synthetic, real.agents, real.context)
        ratio = real.output_tps / synth.output_tps if synth.output_tps > 0 else None
    result = RunResult(
        run_id=run_id,
        created=created,
        agentload_version=__version__,
        target=description,
        model=model,
        workload=plan.workload.name,
        mode=plan.mode,
        settings={
            "warmup_s": plan.warmup_s,
            "window_s": plan.window_s,
            "tolerance": plan.tolerance,
            "slo": str(plan.slo) if plan.slo else None,
            **plan.settings,
        },
        levels=levels,
        capacity=capacity,
        knee=knees,
        real_over_synthetic=ratio,
        notes=notes,
    )
    return result, all_data
