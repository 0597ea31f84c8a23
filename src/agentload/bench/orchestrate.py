"""A whole benchmark: which levels to run (sweep, knee search, context grid, soak), each on a fresh target for the
simulator, compiled into one RunResult with capacity estimates and the explained knee.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Literal

import numpy as np

from agentload import __version__
from agentload.bench.analysis import LevelData, compare_arms, matched_sizes, summarise
from agentload.bench.observe import BenchObserver, Unobserved
from agentload.bench.results import CapacityEstimate, Knee, LevelSummary, RunResult
from agentload.bench.runner import run_level
from agentload.bench.search import Search, Slo, find_knee, sweep, with_ratio
from agentload.bench.soak import GpuMonitor, drift_notes
from agentload.bench.target import Target
from agentload.clock import LoopClock
from agentload.endpoint.connection import ConnectionOptions, open_connection
from agentload.endpoint.output import can_force_length
from agentload.errors import CheckpointError, EndpointError, ServerLostError
from agentload.load.cluster import RayCluster
from agentload.workload.agentic import AgenticWorkload
from agentload.workload.base import Workload
from agentload.workload.registry import TRACE_PREFIX
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing, measure_sizing
from agentload.workload.synthetic import SyntheticWorkload
from agentload.workload.trace import MooncakeWorkload

Mode = Literal["sweep", "find-knee", "grid", "soak", "single"]


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
    observer: BenchObserver | None = None,
    run_id: str | None = None,
    resumed: Sequence[LevelSummary] = (),
    created: str | None = None,
    resume_from_s: float = 0.0,
) -> tuple[RunResult, list[LevelData]]:
    """Run the plan's levels and compile the result; the levels' raw data is returned beside it.

    ``observer`` hears each level as it starts, its connection, each request, the level's raw data and summary as
    it ends (its server samples are written then) and each step of the knee search. ``resumed``: the levels an
    interrupted run of the same plan finished, in order; the plan retraces its steps (a knee search decides from
    the same figures the same way) and takes those instead of measuring them again, so a resumed run measures only
    what the interrupted one had not. ``resume_from_s``: the run time the interrupted run had reached (its last
    sample), so the resumed levels' times follow the kept ones on one axis.
    """
    created = created or datetime.now(UTC).isoformat(timespec="seconds")
    run = _Run(plan, pool, observer or Unobserved(), run_id, resumed, resume_from_s)
    await run.prepare(slots)
    # A lost server ends the run where it is: the levels measured so far, the lost one (marked in its warnings)
    # and the result marked incomplete; no knee or capacity is claimed for the context it was lost in.
    incomplete: str | None = None
    try:
        for context in plan.contexts:
            await run.context(context)
    except _ServerLost as exc:
        incomplete = str(exc)
    if run.probe.virtual:
        await run.probe.transport.aclose()
    if plan.synthetic is not None and run.levels and incomplete is None:
        incomplete = await run.synthetic_arm(plan.synthetic)
    return run.result(created, incomplete), run.all_data


class _Run:
    """One bench run's state as its levels are measured (``run_bench``)."""

    def __init__(self, plan: BenchPlan, pool: tuple[int, int, str] | None, observer: BenchObserver,
                 run_id: str | None, resumed: Sequence[LevelSummary], resume_from_s: float) -> None:  # fmt: skip
        self.plan = plan
        self.pool = pool
        self.observer = observer
        self.run_id = run_id or datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.resumed = resumed
        self.t0 = LoopClock().now() - resume_from_s
        self.all_data: list[LevelData] = []
        self.levels: list[LevelSummary] = []
        self.knees: list[Knee] = []
        self.capacity: list[CapacityEstimate] = []
        self.notes: list[str] = []
        self.synthetic: list[LevelSummary] = []
        self.ratio: float | None = None
        self.why: list[str] = []
        self.probe = plan.make_target()
        self.description, self.model = self.probe.description, self.probe.model
        self.slots: int | None = None
        self.pinned: int | None = None
        self.exact_engine: str | None = None
        self.sizing = SIMULATOR_SIZING

    async def prepare(self, slots: int | None) -> None:
        """Size the text in the server's tokens and settle slot pins and exact output lengths, with their notes."""
        plan, probe = self.plan, self.probe
        self.slots = slots if slots is not None or probe.profile is None else probe.profile.slots
        self.sizing, sizing_note = await measure_token_sizing(probe, plan.seed)
        if sizing_note:
            self.notes.append(sizing_note)
        self.pinned = self.slots if plan.pin_slots and self.slots else None
        # Mooncake's jobs start at their trace times whether or not the agent's earlier ones have finished: pinned
        # to one slot, an agent's overlapping jobs would wait for each other while the other slots sat idle.
        if self.pinned and isinstance(plan.workload, MooncakeWorkload):
            self.pinned = None
            self.notes.append("agents not pinned to slots: the Mooncake trace's jobs overlap (open loop), so the "
                              "server chooses each job's slot")  # fmt: skip
        if self.pinned:
            self.notes.append(f"agents pinned to the server's {self.pinned} slots (id_slot = agent mod "
                              f"{self.pinned}; --no-pin-slots lets the server choose)")  # fmt: skip
        engine = probe.engine
        self.exact_engine = engine if plan.exact_output and can_force_length(engine) else None
        if plan.exact_output and self.exact_engine is None:
            self.notes.append(
                f"the engine ({engine or 'unknown'}) offers no way to ask for exact output lengths: replies are as "
                "long as the model makes them (see each level's realised ÷ requested output)"
            )

    def taken(self, workload: Workload, agents: int, context: int) -> LevelSummary | None:
        """The interrupted run's level in this place, when resuming (it must be the level asked for here)."""
        if len(self.levels) >= len(self.resumed):
            return None
        done = self.resumed[len(self.levels)]
        if (done.workload, done.agents, done.context) != (workload.name, agents, context):
            raise CheckpointError(
                f"the interrupted run's level {done.level} measured {done.agents} agents × {done.context:,} "
                f"tokens of {done.workload}, but resuming asks for {agents} × {context:,} of {workload.name}: "
                "the run was started with other settings or another agentload"
            )
        self.levels.append(done)
        return done

    async def measure(self, workload: Workload, agents: int, context: int, scale: float = 1.0) -> LevelSummary:
        """One level (or the interrupted run's, when resuming); a level the server's loss cut short ends the run."""
        done = self.taken(workload, agents, context)
        if done is not None:
            return done
        plan = self.plan
        target = plan.make_target()
        self.description, self.model = target.description, target.model
        warmup_s = plan.warmup_s * (0.5 if scale < 1.0 else 1.0)
        self.observer.level_started(len(self.levels), agents, context, workload.name, warmup_s, plan.window_s)
        try:
            # A probe (scale < 1) measures at least its share of the window and until it has enough turns, the
            # whole window being the cap; a sweep level measures the whole window and says if it was too few.
            data = await run_level(
                target, workload, agents=agents, context=context, level=len(self.levels), run_id=self.run_id,
                text_salt=SAME_TEXT_SALT if plan.same_text else self.run_id, run_t0=self.t0, warmup_s=warmup_s,
                window_s=plan.window_s, min_window_s=plan.window_s * scale, min_turns=plan.min_turns,
                seed=plan.seed, sink=self.observer.record, sizing=self.sizing,
                exact_output_engine=self.exact_engine, pin_slots=self.pinned, on_connect=self.observer.connected,
                cluster=None if target.virtual else plan.cluster,
            )  # fmt: skip
        finally:
            if target.virtual:
                await target.transport.aclose()
        self.all_data.append(data)
        summary = summarise(data)
        self.levels.append(summary)
        self.observer.level_done(data, summary)
        if data.lost is not None:
            raise _ServerLost(data.lost)
        return summary

    def estimate_at(self, context: int, knee: int | None) -> CapacityEstimate:
        plan, probe, slots = self.plan, self.probe, self.slots
        # Held sessions sit at their context all the time, so pool ÷ the context the server counted is their
        # capacity (tokenizers differ: our words are not the server's tokens). Growing sessions pass through every
        # size up to the target within a window too short to see many of them end, so for them the target stays
        # the divisor.
        holds = isinstance(plan.workload, AgenticWorkload) and plan.workload.growth == "hold"
        # A trace's sessions are the sizes it recorded, whatever --context says: the only context per session there
        # is to divide the pool by is the one the server counted (their mean, so an average, not a bound).
        replay = plan.workload.name.startswith(TRACE_PREFIX)
        real = realised_context(self.levels, context, knee) if holds or replay else None
        if real is None:
            estimate = capacity_for(probe, context, self.pool, slots=slots)
        else:
            estimate = capacity_for(probe, real, self.pool, target_context=context, slots=slots)
            estimate = estimate.model_copy(update={"replay": replay})
        # A slot server shares no prefix across slots, so the shared system prompt is stored once per slot.
        if isinstance(plan.workload, AgenticWorkload) and probe.profile is None and slots is None:
            # The system prompt every agent shares, in server tokens (the workload sizes it so; its template
            # header is left out, a few tokens that only ever round a block down). The simulator's profile
            # layouts (hybrid groups) have their own arithmetic, so this refinement is for real servers.
            estimate = with_shared_prefix(estimate, plan.workload.shape(context).system_tokens)
        return estimate

    async def context(self, context: int) -> None:
        """The plan's levels at one context: a knee searched or swept, or levels held (soak) or measured (single)."""
        plan = self.plan
        scale = plan.probe_scale if plan.mode == "find-knee" else 1.0
        measure = partial(self.measure, plan.workload, context=context, scale=scale)
        if plan.mode in ("find-knee", "sweep", "grid"):
            search = Search(measure, tolerance=plan.tolerance, slo=plan.slo, slots=self.slots,
                            pinned=self.pinned is not None, context=context, on_step=self.observer.step)  # fmt: skip
            if plan.mode == "find-knee":
                knee = await find_knee(search, context, max_agents=plan.max_agents)
            else:
                knee = await sweep(search, plan.agents, context)
            estimate = self.estimate_at(context, knee.agents)
            self.capacity.append(estimate)
            if estimate.replay:  # the knee is said at the context the trace realised, as its estimate is
                knee = knee.model_copy(update={"realised_context": estimate.context})
            self.knees.append(with_ratio(knee, estimate.predicted))
            return
        if plan.mode == "soak":
            await self.soak(measure)
        else:  # single: the levels are measured, no knee is claimed
            for n in plan.agents:
                await measure(n)
        self.capacity.append(self.estimate_at(context, None))

    async def soak(self, measure: Callable[[int], Awaitable[LevelSummary]]) -> None:
        """Hold each level, with the GPUs sampled throughout, and note how it drifted."""
        gpus = GpuMonitor()
        gpus.start()
        try:
            for n in self.plan.agents:
                kept = len(self.all_data)
                await measure(n)
                if len(self.all_data) > kept:  # measured here, not taken from an interrupted run
                    self.notes.extend(drift_notes(self.all_data[-1]))
        finally:
            gpu_notes = await gpus.stop()  # also when the server was lost: no sampler left running
        self.notes.extend(gpu_notes)

    async def synthetic_arm(self, arm: Workload) -> str | None:
        """The matched synthetic arm at the knee (or the last level), for the real ÷ synthetic ratio; returns why
        the run is incomplete when the server was lost during it."""
        at = self.knees[0].agents if self.knees and self.knees[0].agents > 0 else self.levels[-1].agents
        real = next((s for s in self.levels if s.agents == at and s.context == self.plan.contexts[0]), self.levels[-1])
        sizes = matched_sizes(real)
        if isinstance(arm, SyntheticWorkload) and arm.fixed_sizes() is None and sizes is not None:
            arm = arm.matched(*sizes)  # the agents' own mean request, so only structure differs
        try:
            synth = await self.measure(arm, real.agents, real.context)
        except _ServerLost as exc:
            return str(exc)
        # Its own series: not one of the agents' levels (no knee rule, no table row among them).
        self.levels.remove(synth)
        self.synthetic.append(synth)
        self.ratio = real.output_tps / synth.output_tps if synth.output_tps > 0 else None
        self.why = compare_arms(real, synth)
        return None

    def result(self, created: str, incomplete: str | None) -> RunResult:
        plan = self.plan
        return RunResult(
            run_id=self.run_id,
            created=created,
            agentload_version=__version__,
            target=self.description,
            model=self.model,
            workload=plan.workload.name,
            mode=plan.mode,
            settings={
                "warmup_s": plan.warmup_s,
                "window_s": plan.window_s,
                "tolerance": plan.tolerance,
                "slo": str(plan.slo) if plan.slo else None,
                "exact_output": self.exact_engine is not None,
                "pin_slots": self.pinned is not None if self.slots else None,  # None: not a slot server
                "tokens_per_word": round(self.sizing.tokens_per_word, 4),
                "token_sizing": self.sizing.source,
                **plan.settings,
            },
            levels=self.levels,
            capacity=self.capacity,
            knee=self.knees,
            real_over_synthetic=self.ratio,
            synthetic=self.synthetic,
            synthetic_why=self.why,
            notes=self.notes,
            incomplete=incomplete,
        )
