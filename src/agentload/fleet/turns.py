"""What one fleet agent's turns go through, apart from the runner that starts the agent.

A fleet agent's task is a ``ToolConversation`` that ``agent.loop.ConversationDriver`` runs; the loop calls two
things of the fleet's on every turn: the backend (``FleetBackend``, the agents' context's: parks an agent at a
turn boundary when the limiter has narrowed, reports the turn to the limiter, and logs the attempts of a turn
cancelled on the way as an interrupt) and the conversation's ``on_turn`` hook (``CheckpointHook``: commits the
turn to the log, or logs an interrupt and stops the run when the server failed it). They live here rather than in
``fleet/runner.py`` so that no module is called back by one it calls: the runner's agents yield their
conversations to the loop, the loop calls these, and these call neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from agentload.agent.loop import ChatBackend, TurnLog
from agentload.clock import Clock
from agentload.endpoint.backend import TurnCancelled
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.fleet.checkpoint import CheckpointLog, InterruptLine, TurnLine
from agentload.fleet.config import AgentPlan
from agentload.fleet.limiter import Limiter, LimiterStatistics, TurnSample
from agentload.load.runner import ServerLost


class AgentState(StrEnum):
    WAITING = "waiting"  # dependencies pending or no slot yet
    RUNNING = "running"
    PARKED = "parked"  # narrowed out at a turn boundary; resumes when there is room
    INTERRUPTED = "interrupted"  # the server failed its turn; resumable
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    STOPPED = "stopped"  # stopped from the dashboard (or held behind a stopped dependency); resumable


class AgentStopped(Exception):
    """Raised where a stopped agent meets a turn boundary — after its last turn was committed, or before its next
    request is sent — so it ends with nothing in flight; ``fleet.runner`` catches it and writes no ``agent`` line
    (the agent is resumable). Never leaves the runner."""


class FleetProgress(Protocol):
    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None: ...

    def turn(self, agent: str, turn: TurnLog) -> None: ...

    def limiter(self, stats: LimiterStatistics) -> None: ...


class NoProgress:
    """The progress of a run nobody watches (the default)."""

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        return None

    def turn(self, agent: str, turn: TurnLog) -> None:
        return None

    def limiter(self, stats: LimiterStatistics) -> None:
        return None


class FleetRun(Protocol):
    """What an agent's turns read of the run they belong to (``fleet.runner.FleetRunner`` fits)."""

    limiter: Limiter
    progress: FleetProgress
    clock: Clock
    t0: float
    log: CheckpointLog
    segment: int
    stopping: set[str]  # agents asked to stop at their next turn boundary (``FleetRunner.stop_agent``)
    pause: Pause | None  # the dashboard's pause, asked before each request is sent; None: a run without one


class Pause(Protocol):
    """A run-wide pause (``dashboard.control.FleetControl`` fits): while ``paused``, a turn about to be sent waits
    in ``hold`` (an agent stopped meanwhile is then stopped by the backend, its turn not sent)."""

    @property
    def paused(self) -> bool: ...

    async def hold(self, agent: str) -> None: ...


def is_server_failure(record: RequestRecord, server_dead: bool | None = None) -> bool:
    """A final attempt that failed because the server is gone (refused, dead, frozen), not for the agent's sake.

    Only the retry layer's transient kinds can be, and which of them are depends on what is known of the server
    (``server_dead``: the connection's dead-server rule, asked now; None where there is none to ask):

    * a refused connection always is: nothing is listening;
    * a rate limit (429) never is: it is a live server asking for less load. Stopping the fleet for it would cancel
      every other agent's turn while the server answers; the turn fails as the agent's data instead, and the
      limiter, which counts a 429 as overload, narrows the fleet;
    * a stall, a reset, a 5xx or a malformed stream is unless the rule says the server answers: a frozen server
      stalls every stream and a killed one resets them, but one agent's run of such faults on a server that answers
      is that agent's bad luck, and at hundreds of agents some turn meets one (a 1-in-4 fault five times in a row).
    """
    if record.ok or not record.transient or record.http_status == 429:
        return False
    return record.outcome is Outcome.CONNECT_ERROR or server_dead is not False


def _is_overload(record: RequestRecord) -> bool:
    return record.outcome is Outcome.TIMEOUT or record.http_status in (429, 503)


@dataclass
class _Attempt:
    """One agent's turns in this process since it (re)started: what parking and the limiter's feed remember."""

    plan: AgentPlan
    previous: RequestRecord | None  # the agent's last committed reply (its prompt and length make the next prefix)
    rejoin: tuple[int, ...] | None  # a restart's: the priority to queue with if it had given its slot back
    previous_here: bool = False  # was ``previous`` received by this process? (else the cache state is unknown)
    sent: int = 0


class FleetBackend:
    """The fleet's agents' backend (their context's): parks an agent at a turn boundary when the limiter has
    narrowed, and reports each turn to the limiter; the agent is the request's ``ids.agent``.

    ``begin`` starts an agent's attempt afresh (when it starts, and again on a restart): its first request is cold,
    and ``rejoin`` (a restart's) is the priority to queue at the gate with, before that request, when the agent had
    given its slot back (it was restarted while parked).
    """

    def __init__(self, inner: ChatBackend, runner: FleetRun) -> None:
        self.inner = inner
        self.runner = runner
        self.attempts: dict[str, _Attempt] = {}

    def begin(self, plan: AgentPlan, previous: RequestRecord | None, rejoin: tuple[int, ...] | None = None) -> None:
        self.attempts[plan.agent_id] = _Attempt(plan, previous, rejoin)

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        r = self.runner
        aid = ids.agent
        a = self.attempts[aid]
        parked = False
        if a.rejoin is not None and not a.sent and not r.limiter.gate.is_live(aid):
            r.progress.agent(aid, AgentState.PARKED, rounds=ids.turn)
            await r.limiter.gate.enter(aid, a.rejoin)
            r.progress.agent(aid, AgentState.RUNNING, rounds=ids.turn)
        if a.sent and r.limiter.gate.over_limit():
            r.progress.agent(aid, AgentState.PARKED, rounds=ids.turn)
            parked = await r.limiter.gate.yield_if_over(aid, (0, a.plan.wave, a.plan.index))
            r.progress.agent(aid, AgentState.RUNNING, rounds=ids.turn)
        pause = r.pause
        if pause is not None and pause.paused:
            await pause.hold(aid)
        if aid in r.stopping:  # stopped while parked or paused (or just before this turn): it is not sent
            raise AgentStopped(aid)
        # A cold turn prefills what no warm cache holds: an agent's first turn, its first turn in this process
        # (the server's cache may have gone with the last one), its first turn after being parked (evicted
        # meanwhile). The server pays it at any width, so the limiter reads it as a burst, not as load.
        cold = a.sent == 0 or parked
        a.sent += 1
        if cold:
            r.limiter.prefill_started(aid, r.clock.now() - r.t0)
        try:
            records = await self.inner.complete(body, ids)
        except asyncio.CancelledError as cancel:
            # The turn is abandoned (the run stops, or this agent is restarted): nothing of it is committed, and its
            # round is sent again. The attempts that had ended are measurements all the same: logged as an
            # interrupt, as a turn the server failed is. The attempt in flight left no record (``TurnCancelled``).
            attempts = cancel.attempts if isinstance(cancel, TurnCancelled) else []
            if attempts:
                await self._interrupted(ids, attempts)
            raise
        finally:
            if cold:
                r.limiter.prefill_finished(aid, r.clock.now() - r.t0)
        final = records[-1]
        prev = a.previous
        if prev is None or (a.previous_here and not parked):
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
            a.previous = final
            a.previous_here = True
        return records

    async def _interrupted(self, ids: RequestIds, attempts: list[RequestRecord]) -> None:
        r = self.runner
        last = attempts[-1]
        detail = (
            f"{ids.agent} round {ids.turn}: cancelled after {len(attempts)} attempt(s), the last "
            f"{last.outcome.value}: {last.error_message}"
        )
        # Written before append's first await (its fsync): a second cancel cannot lose the line.
        await r.log.append(
            InterruptLine(agent=ids.agent, round=ids.turn, segment=r.segment, records=attempts, detail=detail[:300])
        )


@dataclass(frozen=True)
class FleetContext:
    """What ``ConversationDriver`` runs the fleet's agents' conversations with."""

    backend: FleetBackend
    clock: Clock

    def should_stop(self) -> bool:
        """Never between turns: an agent stops at a committed turn (``AgentStopped``), a run ends by a cancel."""
        return False


class CheckpointHook:
    """``on_turn`` for one agent: each finished turn is on disk before the agent goes on (fleet/checkpoint.py).

    ``committed`` is the agent's committed turns, kept exactly in step with the log: a restart
    (``FleetRunner.restart_agent``) cancels the agent anywhere and resumes it from this list, so a turn whose line
    was written must be in it even when the cancel lands while the line is being fsynced.
    """

    def __init__(
        self,
        run: FleetRun,
        agent: str,
        prior_s: float,
        started: float,
        committed: list[TurnLog] | None = None,
        max_rounds: int | None = None,
        server_dead: Callable[[], bool | None] | None = None,
    ) -> None:
        self.run = run
        self.server_dead = server_dead  # the connection's dead-server rule (``is_server_failure``); None: none
        self.agent = agent
        self.max_rounds = max_rounds  # the agent's round cap: a stop on its last round is no stop (it ends anyway)
        self.prior_s = prior_s  # the agent's active seconds in earlier segments
        self.started = started  # when it started in this one
        self.committed: list[TurnLog] = committed if committed is not None else []

    async def __call__(self, turn: TurnLog) -> None:
        r, aid = self.run, self.agent
        dead = self.server_dead() if self.server_dead is not None else None
        if turn.assistant is None and is_server_failure(turn.final, dead):
            detail = f"{aid} round {turn.round}: {turn.final.outcome.value}: {turn.final.error_message}"
            await r.log.append(
                InterruptLine(agent=aid, round=turn.round, segment=r.segment, records=turn.records, detail=detail[:300])
            )
            r.progress.agent(aid, AgentState.INTERRUPTED, rounds=turn.round, detail=detail)
            raise ServerLost(detail)  # before the turn is committed: the round is sent again on resume
        elapsed = self.prior_s + r.clock.now() - self.started
        line = TurnLine(agent=aid, round=turn.round, segment=r.segment, elapsed_s=elapsed, turn=turn)
        before = r.log.written
        try:
            await r.log.append(line)
        finally:
            # The line is written synchronously, before append's first await (its fsync), so a cancel can only
            # land after it is in the file: then it is committed. A write that failed raised before any await, so
            # no other agent's line can have moved the count in between.
            if r.log.written > before:
                self.committed.append(turn)
                r.progress.turn(aid, turn)
        goes_on = self.max_rounds is None or turn.round + 1 < self.max_rounds
        if aid in r.stopping and turn.assistant is not None and turn.final.tool_calls and goes_on:
            raise AgentStopped(aid)  # committed, and the conversation would go on: this is its turn boundary
