"""The fleet runner: every agent of a fleet, each isolated, as many at once as the limiter allows.

The runner declares what it needs (style.md §3) and imports no concrete server, poller or display: a
``ChatBackend`` (the agent loop's protocol — ``SingleAttemptBackend`` or ``RetryingBackend`` fit), an optional
``SignalSource`` (``endpoint.signals.SignalPoller`` fits), an optional ``FleetProgress`` and a ``Clock``.

Each agent gets its own conversation (``AgentSpec``), tool registry, workspace directory and backend wrapper;
nothing but the server and the limiter is shared. An agent starts once every task it depends on is done (a
failed or skipped dependency skips it), asks the gate for a slot, and runs ``run_agent`` with the turns already
committed in the log (``resume=``); each finished turn is appended to the log before the agent goes on. Per-agent
failures (the server refused the request: a bad model, a prompt too long, an error in the stream) end that agent
as ``failed`` and are data; anything else (a full disk, a bug) stops the whole run, after every agent task has
been cancelled and awaited.

A turn that fails for the server's sake — the retry layer gave up on a failure it counts as transient: refused
or reset connections, stalls the watchdog cut (a dead or frozen server), 429/5xx, a malformed stream — is not
the agent's fault and must not end it (issue 15, item 2: a server killed 15 s in used to mark all 24 agents
failed for good, the unstarted ones too). Its attempts are logged as an ``interrupt`` line, not as a committed
turn, and the whole run stops: every other agent is cancelled at once (their uncommitted turns are sent again on
resume) rather than each burning its own retries on the same dead server. ``SegmentOutcome.server_failure``
says why; ``--resume`` then runs the interrupted and unstarted agents and keeps the finished ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from agentload.agent.loop import ChatBackend, TurnLog, run_agent
from agentload.clock import Clock
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.fleet.checkpoint import AgentLine, CheckpointLog, InterruptLine, LimitLine, LogState, TurnLine
from agentload.fleet.config import AgentPlan
from agentload.fleet.handoff import hand_over
from agentload.fleet.limiter import Limiter, LimiterStatistics, ServerGauges, TurnSample
from agentload.fleet.toolbox import ToolSettings, build_registry

# How often the limiter's policy is asked for a decision (it decides only once a round of fresh turns is in).
CONTROL_INTERVAL_S = 1.0
# Dependency results handed to a dependent task are cut to this many characters each.
DEPENDENCY_RESULT_CHARS = 2000


class SignalSource(Protocol):
    """The server's own gauges, polled in the background; ``latest`` must not block."""

    @property
    def latest(self) -> ServerGauges | None: ...


class AgentState(StrEnum):
    WAITING = "waiting"  # dependencies pending or no slot yet
    RUNNING = "running"
    PARKED = "parked"  # narrowed out at a turn boundary; resumes when there is room
    INTERRUPTED = "interrupted"  # the server failed its turn; resumable
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


class FleetProgress(Protocol):
    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None: ...

    def turn(self, agent: str, turn: TurnLog) -> None: ...

    def limiter(self, stats: LimiterStatistics) -> None: ...


class _NoProgress:
    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        return None

    def turn(self, agent: str, turn: TurnLog) -> None:
        return None

    def limiter(self, stats: LimiterStatistics) -> None:
        return None


@dataclass(frozen=True)
class SegmentOutcome:
    """What the runner measured in this process (the turns themselves are in the log)."""

    wall_s: float
    stopped_early: bool
    limiter: LimiterStatistics
    server_failure: str | None = None  # why a server-level failure stopped the run (None: it did not)


def is_server_failure(record: RequestRecord) -> bool:
    """A final attempt that failed for the server's sake (the retry layer's transient kinds), not the agent's."""
    return not record.ok and record.transient


class _ServerLost(Exception):
    """Raised out of one agent to stop the run; never leaves ``FleetRunner.run``."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _is_overload(record: RequestRecord) -> bool:
    return record.outcome is Outcome.TIMEOUT or record.http_status in (429, 503)


class _AgentBackend:
    """One agent's view of the shared backend: parks at turn boundaries and reports each turn to the limiter."""

    def __init__(
        self,
        inner: ChatBackend,
        runner: FleetRunner,
        plan: AgentPlan,
        previous: RequestRecord | None,
    ) -> None:
        self.inner = inner
        self.runner = runner
        self.plan = plan
        self.previous = previous  # the agent's last committed reply (its prompt and length make the next prefix)
        self.previous_here = False  # was ``previous`` received by this process? (else the cache state is unknown)
        self.sent = 0

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        r = self.runner
        aid = self.plan.agent_id
        parked = False
        if self.sent and r.limiter.gate.over_limit():
            r.progress.agent(aid, AgentState.PARKED, rounds=ids.turn)
            parked = await r.limiter.gate.yield_if_over(aid, (0, self.plan.wave, self.plan.index))
            r.progress.agent(aid, AgentState.RUNNING, rounds=ids.turn)
        # A cold turn prefills what no warm cache holds: an agent's first turn, its first turn in this process
        # (the server's cache may have gone with the last one), its first turn after being parked (evicted
        # meanwhile). The server pays it at any width, so the limiter reads it as a burst, not as load.
        cold = self.sent == 0 or parked
        self.sent += 1
        if cold:
            r.limiter.prefill_started(aid, r.clock.now() - r.t0)
        try:
            records = await self.inner.complete(body, ids)
        finally:
            if cold:
                r.limiter.prefill_finished(aid, r.clock.now() - r.t0)
        final = records[-1]
        prev = self.previous
        if prev is None or (self.previous_here and not parked):
            reusable = prev.prompt_tokens if prev is not None else 0
            grown = final.prompt_tokens - (prev.prompt_tokens + prev.completion_tokens if prev else 0)
            t0 = r.t0
            r.limiter.observe(
                TurnSample(
                    agent=aid,
                    sent=final.t_sent - t0,
                    done=final.t_done - t0,
                    ttft=final.ttft,
                    new_tokens=max(0, grown),
                    reusable_tokens=reusable,
                    cached_tokens=final.cached_tokens,
                    prev_done=(prev.t_done - t0) if prev is not None else None,
                    ok=final.ok,
                    overloaded=any(_is_overload(x) for x in records),
                )
            )
        if final.ok:
            self.previous = final
            self.previous_here = True
        return records


class FleetRunner:
    def __init__(
        self,
        plans: Sequence[AgentPlan],
        *,
        backend: ChatBackend,
        limiter: Limiter,
        log: CheckpointLog,
        state: LogState,
        clock: Clock,
        workspaces: Path,
        model: str,
        run_id: str = "",
        segment: int = 0,
        signals: SignalSource | None = None,
        progress: FleetProgress | None = None,
        stop_after_s: float | None = None,
        control_interval_s: float = CONTROL_INTERVAL_S,
    ) -> None:
        self.plans = list(plans)
        self.backend = backend
        self.limiter = limiter
        self.log = log
        self.state = state
        self.clock = clock
        self.workspaces = workspaces
        self.model = model
        self.run_id = run_id
        self.segment = segment
        self.signals = signals
        self.progress: FleetProgress = progress or _NoProgress()
        self.stop_after_s = stop_after_s
        self.control_interval_s = control_interval_s
        self.t0 = clock.now()
        by_task: dict[str, list[AgentPlan]] = {}
        for p in self.plans:
            by_task.setdefault(p.task_id, []).append(p)
        self._by_task = by_task
        self._task_done = {tid: asyncio.Event() for tid in by_task}
        self._task_remaining = {tid: len(ps) for tid, ps in by_task.items()}
        self._outcomes: dict[str, AgentLine] = dict(state.finished)

    # -- the run ----------------------------------------------------------------------------------------------
    async def run(self) -> SegmentOutcome:
        self.t0 = self.clock.now()
        for p in self.plans:
            if p.agent_id in self._outcomes:
                self._finished(p)
        agents = [asyncio.create_task(self._agent(p), name=f"agent-{p.agent_id}") for p in self.plans]
        control = asyncio.create_task(self._control(), name="fleet-control")
        timer = (
            asyncio.create_task(self.clock.sleep(self.stop_after_s), name="fleet-stop-after")
            if self.stop_after_s is not None
            else None
        )
        stopped = False
        server_failure: str | None = None
        try:
            pending: set[asyncio.Task[Any]] = set(agents)
            while pending and server_failure is None:
                waiters: set[asyncio.Task[Any]] = pending | ({timer} if timer else set())
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is timer:
                        continue
                    try:
                        task.result()  # a run-level failure: re-raised after cleanup below
                    except _ServerLost as lost:
                        server_failure = server_failure or lost.detail
                pending -= done
                if server_failure is not None:
                    stopped = bool(pending)
                elif timer is not None and timer in done:
                    stopped = bool(pending)
                    break
        finally:
            for task in [*agents, control, *([timer] if timer else [])]:
                task.cancel()
            for task in [*agents, control, *([timer] if timer else [])]:
                # Agents that met the dead server too have said so already: one reason stops the run.
                with contextlib.suppress(asyncio.CancelledError, _ServerLost):
                    await task
        return SegmentOutcome(self.clock.now() - self.t0, stopped, self.limiter.statistics(), server_failure)

    async def _control(self) -> None:
        while True:
            await self.clock.sleep(self.control_interval_s)
            gauges = self.signals.latest if self.signals is not None else None
            change = self.limiter.tick(self.clock.now() - self.t0, gauges)
            if change is not None:
                await self.log.append(LimitLine(segment=self.segment, change=change))
                self.progress.limiter(self.limiter.statistics())

    # -- one agent --------------------------------------------------------------------------------------------
    def _finished(self, plan: AgentPlan) -> None:
        self._task_remaining[plan.task_id] -= 1
        if self._task_remaining[plan.task_id] == 0:
            self._task_done[plan.task_id].set()

    def _dependency_results(self, plan: AgentPlan) -> tuple[dict[str, str], str | None]:
        results: dict[str, str] = {}
        for dep in plan.depends_on:
            for p in self._by_task[dep]:
                line = self._outcomes.get(p.agent_id)
                if line is None or line.outcome != "done":
                    why = "failed" if line is not None and line.outcome == "failed" else "was skipped"
                    return {}, f"dependency {p.agent_id} {why}"
                results[p.agent_id] = line.final_content[:DEPENDENCY_RESULT_CHARS]
        return results, None

    async def _agent(self, plan: AgentPlan) -> None:
        aid = plan.agent_id
        if aid in self._outcomes:
            line = self._outcomes[aid]
            self.progress.agent(aid, AgentState(line.outcome), rounds=len(self.state.turns.get(aid, [])))
            return
        self.progress.agent(aid, AgentState.WAITING, rounds=len(self.state.turns.get(aid, [])))
        for dep in plan.depends_on:
            await self._task_done[dep].wait()
        dep_results, blocked = self._dependency_results(plan)
        if blocked is not None:
            await self._record(plan, AgentLine(agent=aid, outcome="skipped", detail=blocked))
            return
        committed = self.state.committed(aid)
        prior = self.state.elapsed(aid)
        gate = self.limiter.gate
        await gate.enter(aid, (0 if committed else 1, plan.wave, plan.index))
        started = self.clock.now()
        try:
            self.progress.agent(aid, AgentState.RUNNING, rounds=len(committed))
            # The dependencies' files, copied into this agent's own workspace (fleet/handoff.py).
            handed = hand_over(self.workspaces, aid, dep_results) if dep_results and "read_file" in plan.tools else []
            spec = plan.spec(self.model, dep_results, handed)
            searches = sum(1 for t in committed if t.assistant for c in t.final.tool_calls if c.name == "search")
            tools = build_registry(
                plan.tools,
                ToolSettings(aid, self.workspaces / aid, plan.tool_result_tokens, plan.tool_latency_s, searches),
            )
            previous = next((t.final for t in reversed(committed) if t.final.ok), None)
            backend = _AgentBackend(self.backend, self, plan, previous)

            async def on_turn(turn: TurnLog) -> None:
                if turn.assistant is None and is_server_failure(turn.final):
                    detail = f"{aid} round {turn.round}: {turn.final.outcome.value}: {turn.final.error_message}"
                    await self.log.append(
                        InterruptLine(
                            agent=aid, round=turn.round, segment=self.segment, records=turn.records, detail=detail[:300]
                        )
                    )
                    self.progress.agent(aid, AgentState.INTERRUPTED, rounds=turn.round, detail=detail)
                    raise _ServerLost(detail)  # before the turn is committed: the round is sent again on resume
                elapsed = prior + self.clock.now() - started
                await self.log.append(
                    TurnLine(agent=aid, round=turn.round, segment=self.segment, elapsed_s=elapsed, turn=turn)
                )
                self.progress.turn(aid, turn)

            transcript = await run_agent(
                spec, backend, tools, self.clock, run_id=self.run_id, on_turn=on_turn, resume=committed
            )
        finally:
            gate.leave(aid)
        outcome = "failed" if transcript.stop_reason == "failed" else "done"
        detail = ""
        if outcome == "failed" and transcript.turns:
            final = transcript.turns[-1].final
            detail = f"{final.outcome.value}: {final.error_message}"[:300]
        await self._record(
            plan,
            AgentLine(
                agent=aid,
                outcome=outcome,
                stop_reason=transcript.stop_reason,
                elapsed_s=prior + self.clock.now() - started,
                final_content=transcript.final_content,
                detail=detail,
            ),
        )

    async def _record(self, plan: AgentPlan, line: AgentLine) -> None:
        await self.log.append(line)
        self._outcomes[plan.agent_id] = line
        self.progress.agent(plan.agent_id, AgentState(line.outcome), detail=line.detail)
        self._finished(plan)
