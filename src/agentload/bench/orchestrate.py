"""A whole benchmark: which levels to run (sweep, knee search, context grid, soak), each on a fresh target for the
simulator, compiled into one RunResult with capacity estimates and the explained knee.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

import numpy as np

from agentload import __version__
from agentload.bench.analysis import LevelData, compare_arms, matched_sizes, summarise
from agentload.bench.results import CapacityEstimate, Knee, LevelSummary, RunResult
from agentload.bench.runner import run_level
from agentload.bench.search import Search, SearchStep, Slo, find_knee, sweep, with_ratio
from agentload.bench.soak import GpuMonitor, drift_notes
from agentload.bench.target import Target
from agentload.clock import LoopClock
from agentload.endpoint.backend import RecordSink
from agentload.endpoint.connection import Connection, ConnectionOptions, open_connection
from agentload.endpoint.output import can_force_length
from agentload.errors import CheckpointError, EndpointError, ServerLostError
from agentload.load.cluster import RayCluster
from agentload.workload.agentic import AgenticWorkload
from agentload.workload.base import Workload
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing, measure_sizing
from agentload.workload.synthetic import SyntheticWorkload
from agentload.workload.trace import MooncakeWorkload

Mode = Literal["sweep", "find-knee", "grid", "soak", "single"]
LevelHook = Callable[[LevelSummary], None]
DataHook = Callable[[LevelData], None]


class BenchWatch(Protocol):
    """What a live view hears of a bench as it runs (``dashboard.bench.BenchBoard`` fits); levels as they end come
    through ``on_level`` and requests through the record sink, as for everyone else."""

    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None: ...  # fmt: skip

    def connected(self, conn: Connection) -> Callable[[], None]:
        """A level's connection is open; returns what undoes the subscription."""
        ...

    def step(self, step: SearchStep) -> None: ...


# What ``--same-text`` salts every run's text with in place of its run id: a constant, so the seed alone decides it.
SAME_TEXT_SALT = "same-text"


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
    same_text: bool = False  # the text from the seed alone, not salted with the run (``--same-text``)
    # Ask the engine for exactly each request's max_tokens (``endpoint.output``); False: the model decides
    # (``--natural-output``).
    exact_output: bool = True
    min_turns: int | None = None  # completed turns a window wants in all (default 60; 8 per agent apply)
    pin_slots: bool = True  # on a slot server, agent i's turns go to slot i mod N (``endpoint.pinning``)
    settings: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    cluster: RayCluster | None = None  # --executor ray: the levels' agents run on its actors (``bench.distributed``)


def capacity_for(
    target: Target,
    context: int,
    pool: tuple[int, int, str] | None,
    target_context: int | None = None,
    slots: int | None = None,
) -> CapacityEstimate:
    """Pool ÷ context per session, in whole blocks as vLLM counts them; capped at ``slots`` on a slot server.

    ``context`` is the realised context (server tokens) when the run measured it, ``target_context`` the asked one.
    """
    if target.profile is not None:
        p = target.profile
        return CapacityEstimate(
            pool_tokens=p.pool_tokens,
            block_size=p.block_size,
            context=context,
            sessions=p.layout.naive_sessions(p.num_blocks, context),
            source=f"simulator profile {p.name} ({p.pool_source})",
            target_context=target_context,
            slots=p.slots,
        )
    if pool is None and slots is not None:
        # llama.cpp states slots, not a paged pool (probe gives no exact block size): the slots are the capacity.
        return CapacityEstimate(pool_tokens=None, block_size=None, context=context, sessions=float(slots),
                                source=f"{slots} parallel slots (a slot server runs at most that many requests)",
                                target_context=target_context, slots=slots)  # fmt: skip
    if pool is None:
        return CapacityEstimate(pool_tokens=None, block_size=None, context=context, sessions=None,
                                source="the server does not report its KV pool",
                                target_context=target_context)  # fmt: skip
    tokens, block, source = pool
    sessions = (tokens // block) / -(-context // block)
    return CapacityEstimate(pool_tokens=tokens, block_size=block, context=context, sessions=sessions, source=source,
                            target_context=target_context, slots=slots)  # fmt: skip


def realised_context(levels: list[LevelSummary], context: int, knee: int | None) -> int | None:
    """The context the server counted at this target: the median of the levels' means, up to the knee.

    For held sessions (the only ones this is used for) the mean prompt + reply is what each session keeps in the
    pool all the time. Levels past the knee are left out where there are others: their turns are fewer and skewed
    toward the agents the server served first. None when no level measured it (no usage from the server).
    """
    at = [lv for lv in levels if lv.context == context and lv.context_mean is not None]
    below = [lv for lv in at if knee is None or lv.agents <= knee] or at
    if not below:
        return None
    return round(float(np.median([lv.context_mean or 0.0 for lv in below])))


def with_shared_prefix(estimate: CapacityEstimate, shared_tokens: int) -> CapacityEstimate:
    """The estimate with a shared system prompt's full blocks stored once (vLLM hashes only full blocks)."""
    if estimate.pool_tokens is None or estimate.block_size is None or estimate.sessions is None:
        return estimate
    block = estimate.block_size
    shared = shared_tokens // block
    per_session = -(-estimate.context // block)
    if shared <= 0 or shared >= per_session:
        return estimate
    sessions = (estimate.pool_tokens // block - shared) / (per_session - shared)
    return estimate.model_copy(update={"shared_prefix_tokens": shared_tokens, "sessions_shared_prefix": sessions})


# The first-token floor of token sizing on a server that shows no load (see ``measure_token_sizing``).
COLD_FIRST_TOKEN_S = 300.0


class _ServerLost(Exception):
    """A level stopped because the server was lost; ends the search (caught in ``run_bench``)."""


async def measure_token_sizing(target: Target, seed: int) -> tuple[TokenSizing, str | None]:
    """The server's tokens per word of our text (``workload.sizing``); the simulator's figures and a note if not.

    Its requests go through the stall watchdog, so a server that froze since the probe is given up within ~25 s
    rather than the 300 s a plain first-token deadline would wait, and that is a lost server, not a note.

    The first token may be long in coming: a cold server compiles or loads on its first request (Ollama loads the
    model then, for minutes). A server that shows its load (running / waiting gauges, llama.cpp's slots) needs no
    long floor for that — the watchdog waits past the default one while the server shows a request queued or
    running — so the ``COLD_FIRST_TOKEN_S`` floor is kept only for a server that shows none, where nothing else
    can tell a cold model from a dead engine behind a proxy that answers with keep-alives.
    """
    options = ConnectionOptions(first_token_floor_s=COLD_FIRST_TOKEN_S, single_attempt=True)
    async with open_connection(target.base_url, target.transport, options=options) as conn:
        signals = await conn.monitor.poll_once()
        if signals.running is not None or signals.slots_busy is not None:
            conn.watchdog.first_token_floor_s = ConnectionOptions().first_token_floor_s
        try:
            return await measure_sizing(conn.backend, target.model, seed=seed), None
        except EndpointError as exc:
            if conn.watchdog.server_dead():
                lost = await conn.liveness.describe()
                raise ServerLostError(f"before the first level: {lost}") from exc
            return SIMULATOR_SIZING, f"text sized at one token per word: {exc}"


async def run_bench(
    plan: BenchPlan,
    *,
    pool: tuple[int, int, str] | None = None,
    slots: int | None = None,
    on_level: LevelHook | None = None,
    sink: RecordSink | None = None,
    run_id: str | None = None,
    on_data: DataHook | None = None,
    resumed: Sequence[LevelSummary] = (),
    created: str | None = None,
    resume_from_s: float = 0.0,
    watch: BenchWatch | None = None,
) -> tuple[RunResult, list[LevelData]]:
    """Run the plan's levels and compile the result; the levels' raw data is returned beside it.

    ``on_data`` gets each level's raw data as it ends (its server samples are written then), ``on_level`` its
    summary. ``resumed``: the levels an interrupted run of the same plan finished, in order; the plan retraces its
    steps (a knee search decides from the same figures the same way) and takes those instead of measuring them
    again, so a resumed run measures only what the interrupted one had not. ``resume_from_s``: the run time the
    interrupted run had reached (its last sample), so the resumed levels' times follow the kept ones on one axis.
    ``watch``: a live view (``bench --dashboard``) told when each level starts, its connection, and each step of
    the search.
    """
    run_id = run_id or datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    created = created or datetime.now(UTC).isoformat(timespec="seconds")
    t0 = LoopClock().now() - resume_from_s
    all_data: list[LevelData] = []
    levels: list[LevelSummary] = []
    knees: list[Knee] = []
    capacity: list[CapacityEstimate] = []
    notes: list[str] = []
    description = ""
    model = ""

    probe_target = plan.make_target()
    description, model = probe_target.description, probe_target.model
    if slots is None and probe_target.profile is not None:
        slots = probe_target.profile.slots
    sizing, sizing_note = await measure_token_sizing(probe_target, plan.seed)
    if sizing_note:
        notes.append(sizing_note)
    engine = probe_target.engine
    pinned = slots if plan.pin_slots and slots else None
    # Mooncake's jobs start at their trace times whether or not the agent's earlier ones have finished: pinned to
    # one slot, an agent's overlapping jobs would wait for each other while the other slots sat idle.
    if pinned and isinstance(plan.workload, MooncakeWorkload):
        pinned = None
        notes.append("agents not pinned to slots: the Mooncake trace's jobs overlap (open loop), so the server "
                     "chooses each job's slot")  # fmt: skip
    if pinned:
        notes.append(f"agents pinned to the server's {pinned} slots (id_slot = agent mod {pinned}; --no-pin-slots "
                     "lets the server choose)")  # fmt: skip
    exact_engine = engine if plan.exact_output and can_force_length(engine) else None
    if plan.exact_output and exact_engine is None:
        notes.append(
            f"the engine ({engine or 'unknown'}) offers no way to ask for exact output lengths: replies are as long "
            "as the model makes them (see each level's realised ÷ requested output)"
        )

    async def measure_with(workload: Workload, agents: int, context: int, scale: float = 1.0) -> LevelSummary:
        nonlocal description, model
        if len(levels) < len(resumed):
            done = resumed[len(levels)]
            if (done.workload, done.agents, done.context) != (workload.name, agents, context):
                raise CheckpointError(
                    f"the interrupted run's level {done.level} measured {done.agents} agents × {done.context:,} "
                    f"tokens of {done.workload}, but resuming asks for {agents} × {context:,} of {workload.name}: "
                    "the run was started with other settings or another agentload"
                )
            levels.append(done)
            return done
        target = plan.make_target()
        description, model = target.description, target.model
        warmup_s = plan.warmup_s * (0.5 if scale < 1.0 else 1.0)
        if watch is not None:
            watch.level_started(len(levels), agents, context, workload.name, warmup_s, plan.window_s)
        try:
            # A probe (scale < 1) measures at least its share of the window and until it has enough turns, the
            # whole window being the cap; a sweep level measures the whole window and says if it was too few.
            data = await run_level(
                target,
                workload,
                agents=agents,
                context=context,
                level=len(levels),
                run_id=run_id,
                text_salt=SAME_TEXT_SALT if plan.same_text else run_id,
                run_t0=t0,
                warmup_s=warmup_s,
                window_s=plan.window_s,
                min_window_s=plan.window_s * scale,
                min_turns=plan.min_turns,
                seed=plan.seed,
                sink=sink,
                sizing=sizing,
                exact_output_engine=exact_engine,
                pin_slots=pinned,
                on_connect=watch.connected if watch is not None else None,
                cluster=None if target.virtual else plan.cluster,
            )
        finally:
            if target.virtual:
                await target.transport.aclose()
        all_data.append(data)
        if on_data is not None:
            on_data(data)
        summary = summarise(data)
        levels.append(summary)
        if on_level is not None:
            on_level(summary)
        if data.lost is not None:
            raise _ServerLost(data.lost)
        return summary

    # Held sessions sit at their context all the time, so pool ÷ the context the server counted is their capacity
    # (tokenizers differ: our words are not the server's tokens). Growing sessions pass through every size up to
    # the target within a window too short to see many of them end, so for them the target stays the divisor.
    holds = isinstance(plan.workload, AgenticWorkload) and plan.workload.growth == "hold"

    def estimate_at(context: int, knee: int | None) -> CapacityEstimate:
        real = realised_context(levels, context, knee) if holds else None
        if real is None:
            estimate = capacity_for(probe_target, context, pool, slots=slots)
        else:
            estimate = capacity_for(probe_target, real, pool, target_context=context, slots=slots)
        # A slot server shares no prefix across slots, so the shared system prompt is stored once per slot.
        if isinstance(plan.workload, AgenticWorkload) and probe_target.profile is None and slots is None:
            # The system prompt every agent shares, in server tokens (the workload sizes it so; its template
            # header is left out, a few tokens that only ever round a block down). The simulator's profile
            # layouts (hybrid groups) have their own arithmetic, so this refinement is for real servers.
            estimate = with_shared_prefix(estimate, plan.workload.shape(context).system_tokens)
        return estimate

    # A lost server ends the run where it is: the levels measured so far, the lost one (marked in its warnings)
    # and the result marked incomplete; no knee or capacity is claimed for the context it was lost in.
    incomplete: str | None = None
    try:
        for context in plan.contexts:
            scale = plan.probe_scale if plan.mode == "find-knee" else 1.0

            async def measure(agents: int, context: int = context, scale: float = scale) -> LevelSummary:
                return await measure_with(plan.workload, agents, context, scale)

            search = Search(measure, tolerance=plan.tolerance, slo=plan.slo, slots=slots, pinned=pinned is not None,
                            context=context, on_step=watch.step if watch is not None else None)  # fmt: skip
            if plan.mode == "find-knee":
                knee = await find_knee(search, context, max_agents=plan.max_agents)
            elif plan.mode in ("sweep", "grid"):
                knee = await sweep(search, plan.agents, context)
            elif plan.mode == "soak":
                gpus = GpuMonitor()
                gpus.start()
                try:
                    for n in plan.agents:
                        kept = len(all_data)
                        await measure(n)
                        if len(all_data) > kept:  # measured here, not taken from an interrupted run
                            notes.extend(drift_notes(all_data[-1]))
                finally:
                    gpu_notes = await gpus.stop()  # also when the server was lost: no sampler left running
                notes.extend(gpu_notes)
                capacity.append(estimate_at(context, None))
                continue
            else:  # single: the levels are measured, no knee is claimed
                for n in plan.agents:
                    await measure(n)
                capacity.append(estimate_at(context, None))
                continue
            estimate = estimate_at(context, knee.agents)
            capacity.append(estimate)
            knees.append(with_ratio(knee, estimate.predicted))
    except _ServerLost as exc:
        incomplete = str(exc)
    if probe_target.virtual:
        await probe_target.transport.aclose()

    ratio = None
    synthetic: list[LevelSummary] = []
    why: list[str] = []
    if plan.synthetic is not None and levels and incomplete is None:
        at = knees[0].agents if knees and knees[0].agents > 0 else levels[-1].agents
        real = next((s for s in levels if s.agents == at and s.context == plan.contexts[0]), levels[-1])
        arm = plan.synthetic
        sizes = matched_sizes(real)
        if isinstance(arm, SyntheticWorkload) and arm.fixed_sizes() is None and sizes is not None:
            arm = arm.matched(*sizes)  # the agents' own mean request, so only structure differs
        try:
            synth = await measure_with(arm, real.agents, real.context)
        except _ServerLost as exc:
            incomplete = str(exc)
        else:
            # Its own series: not one of the agents' levels (no knee rule, no table row among them).
            levels.remove(synth)
            synthetic.append(synth)
            ratio = real.output_tps / synth.output_tps if synth.output_tps > 0 else None
            why = compare_arms(real, synth)
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
            "exact_output": exact_engine is not None,
            "pin_slots": pinned is not None if slots else None,  # None: not a slot server
            "tokens_per_word": round(sizing.tokens_per_word, 4),
            "token_sizing": sizing.source,
            **plan.settings,
        },
        levels=levels,
        capacity=capacity,
        knee=knees,
        real_over_synthetic=ratio,
        synthetic=synthetic,
        synthetic_why=why,
        notes=notes,
        incomplete=incomplete,
    )
    return result, all_data
