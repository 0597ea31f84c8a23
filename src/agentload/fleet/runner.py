"""The fleet runner: every agent of a fleet, each isolated, as many at once as the limiter allows.

The runner declares what it needs and imports no concrete server, poller or display: a
``ChatBackend`` (the agent loop's protocol — ``SingleAttemptBackend`` or ``RetryingBackend`` fit), an optional
``SignalSource`` (``endpoint.signals.SignalPoller`` fits), an optional ``FleetProgress`` and a ``Clock``.

Each agent gets its own conversation (``AgentSpec``), tool registry, workspace directory and backend wrapper;
nothing but the server and the limiter is shared. Each agent (``_FleetAgent``) is an
``agent.loop.ConversationDriver`` on the one runner (``load.runner``), started through its ``Gated`` strategy over
the limiter's gate; like bench's workloads' agents it yields its task as a ``ToolConversation`` and the loop runs
it. An agent starts once every task it depends on is done (a failed or skipped dependency skips it), asks the
gate for a slot, and yields its conversation from the turns already committed in the log (``resume=``); each
finished turn is appended to the log (the conversation's ``on_turn`` hook) before the agent goes on. Per-agent
failures (the server refused the request: a bad model, a prompt too long, an error in the stream) end that agent
as ``failed`` and are data; anything else (a full disk, a bug) stops the whole run, after every agent task has
been cancelled and awaited.

A turn that fails because the server is gone — the retry layer gave up on refused connections, or on stalls,
resets, 5xx or malformed streams while the connection's dead-server rule says the server is dead (or there is no
rule to ask): ``fleet.turns.is_server_failure`` — is not the agent's fault and must not end it (a server killed
15 s in used to mark all 24 agents failed for good, the unstarted ones too). Its attempts are logged as an
``interrupt`` line, not as a committed turn, and the whole run stops: every other agent is cancelled at once
(their uncommitted turns are sent again on resume, and the attempts they had made are logged as interrupts too)
rather than each burning its own retries on the same dead server. ``SegmentOutcome.server_failure`` says why;
``--resume`` then runs the interrupted and unstarted agents and keeps the finished ones. A rate limit (429) never
stops the run, and neither does one agent's run of faults on a server that answers: that turn fails as the
agent's data, and the limiter narrows on the overload it saw.
The per-turn side — the backend view that parks and feeds the limiter, the checkpoint hook that commits a
turn or stops the run — is ``fleet/turns.py``'s, so the loop never calls back into this module during a turn.

One agent can be stopped or restarted while the others run (the dashboard's card buttons), both on the
checkpointed path a kill + resume takes:

* ``stop_agent`` — the agent ends at its next turn boundary: the turn in flight finishes and is committed, then
  it stops (``AgentStopped``, raised by the checkpoint hook after the commit or by the backend view before a
  request is sent); an agent not yet started never starts. No ``agent`` line is written, so it stays resumable
  (``--resume`` continues it from its last committed turn), and the agents that depend on it are held with it.
* ``restart_agent`` — the agent's turn in flight is abandoned: its conversation is cancelled (the agent's task,
  with ``RESTART``; the agent takes that cancel back), nothing of that turn is committed, and it runs again from
  its last committed turn (the checkpoint hook's list, in step with the log), in the same slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentload.agent.loop import ChatBackend, ConversationDriver, Steps, ToolConversation
from agentload.clock import Clock
from agentload.errors import ConfigError
from agentload.fleet.checkpoint import AgentLine, CheckpointLog, LimitLine, LogState
from agentload.fleet.config import AgentPlan
from agentload.fleet.handoff import hand_over
from agentload.fleet.limiter import Limiter, LimiterStatistics, ServerGauges
from agentload.fleet.toolbox import ToolSettings, build_registry
from agentload.fleet.turns import AgentState as AgentState  # re-exported: progress and the CLI name it here
from agentload.fleet.turns import AgentStopped, CheckpointHook, FleetBackend, FleetContext, NoProgress, Pause
from agentload.fleet.turns import FleetProgress as FleetProgress
from agentload.load.runner import End, LoadOutcome, run_load
from agentload.load.strategy import Gated

# How often the limiter's policy is asked for a decision (it decides only once a round of fresh turns is in).
CONTROL_INTERVAL_S = 1.0
# Dependency results handed to a dependent task are cut to this many characters each.
DEPENDENCY_RESULT_CHARS = 2000
# The message of a restart's cancel (``FleetRunner.restart_agent``): the agent takes back only this cancel.
RESTART = "agentload: restart this agent"


@runtime_checkable
class ServerCheck(Protocol):
    """A backend that can say whether the server is gone (``RetryingBackend`` over the connection's watchdog)."""

    def server_dead(self) -> bool | None: ...


class SignalSource(Protocol):
    """The server's own gauges, polled in the background; ``latest`` must not block."""

    @property
    def latest(self) -> ServerGauges | None: ...


@dataclass(frozen=True)
class SegmentOutcome:
    """What the runner measured in this process (the turns themselves are in the log)."""

    wall_s: float
    stopped_early: bool
    limiter: LimiterStatistics
    server_failure: str | None = None  # why a server-level failure stopped the run (None: it did not)


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
        stop: asyncio.Event | None = None,
        pause: Pause | None = None,
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
        self.progress: FleetProgress = progress or NoProgress()
        self.stop_after_s = stop_after_s
        self.control_interval_s = control_interval_s
        self.stop = stop  # set from outside (the dashboard's Stop): ends the segment as --stop-after does
        self.pause = pause  # the dashboard's Pause: each turn asks it before its request is sent
        self.t0 = clock.now()
        self.by_task: dict[str, list[AgentPlan]] = {}
        self.plans_by_id = {p.agent_id: p for p in self.plans}
        for p in self.plans:
            self.by_task.setdefault(p.task_id, []).append(p)
        self.outcomes: dict[str, AgentLine] = dict(state.finished)
        self.stopping: set[str] = set()  # asked to stop at their next turn boundary
        self.held: set[str] = set()  # ended in this segment without an outcome: stopped, or behind a stopped one
        self.restarting: set[str] = set()
        self.attempts: dict[str, asyncio.Task[Any]] = {}  # running agents' tasks, while a conversation is in flight

    # -- the run ----------------------------------------------------------------------------------------------
    async def run(self) -> SegmentOutcome:
        """Every agent on the one runner (``load.runner``), gated by the limiter; ends when they are, or sooner.

        The ``Gated`` strategy waits for each agent's dependencies, admits it through the limiter's gate (resumed
        agents first, then by wave and order) and ticks the limiter every ``control_interval_s``. ``stop_after_s``
        ends the segment with no grace: a turn cut short is not committed and is sent again on resume.
        """
        self.t0 = self.clock.now()
        agents = [_FleetAgent(self, p) for p in self.plans]
        strategy = Gated(self.limiter.gate, clock=self.clock, control=self._tick, interval_s=self.control_interval_s)
        ctx = FleetContext(FleetBackend(self.backend, self), self.clock)
        load = run_load(agents, ctx, strategy=strategy, stop_after_s=self.stop_after_s, clock=self.clock)
        outcome = await load if self.stop is None else await _unless(load, self.stop)
        if outcome is None:  # stopped from outside
            return SegmentOutcome(self.clock.now() - self.t0, True, self.limiter.statistics())
        stopped = outcome.ended in (End.TIMER, End.LOST) and outcome.cancelled > 0
        return SegmentOutcome(self.clock.now() - self.t0, stopped, self.limiter.statistics(), outcome.lost)

    async def _tick(self) -> None:
        gauges = self.signals.latest if self.signals is not None else None
        change = self.limiter.tick(self.clock.now() - self.t0, gauges)
        if change is not None:
            await self.log.append(LimitLine(segment=self.segment, change=change))
            self.progress.limiter(self.limiter.statistics())

    # -- one agent ----------------------------------------------------------------------------------------------
    def _check_agent(self, agent: str) -> None:
        if agent not in self.plans_by_id:
            raise ConfigError(f"no agent {agent!r} in this fleet")
        line = self.outcomes.get(agent)
        if line is not None:
            raise ConfigError(f"agent {agent} has already ended ({line.outcome})")

    def stop_agent(self, agent: str) -> None:
        """Stop ``agent`` at its next turn boundary (idempotent); it stays resumable. See the module docstring."""
        self._check_agent(agent)
        self.stopping.add(agent)

    def restart_agent(self, agent: str) -> None:
        """Abandon ``agent``'s turn in flight and run it again from its last committed turn."""
        self._check_agent(agent)
        if agent in self.stopping:
            raise ConfigError(f"agent {agent} is stopping; continue it with agentload run --resume")
        attempt = self.attempts.get(agent)
        if attempt is None or attempt.done():
            raise ConfigError(f"agent {agent} is not running (only a running agent can be restarted)")
        if attempt.cancel(RESTART):  # False: it finished in this very tick, and there is nothing to restart
            self.restarting.add(agent)

    def server_dead(self) -> bool | None:
        """The backend's dead-server rule (``RetryingBackend.server_dead``), asked now; None without one."""
        return self.backend.server_dead() if isinstance(self.backend, ServerCheck) else None

    def hold(self, agent: str, rounds: int, why: str) -> None:
        self.held.add(agent)
        self.progress.agent(agent, AgentState.STOPPED, rounds=rounds, detail=why)

    async def record(self, plan: AgentPlan, line: AgentLine) -> None:
        await self.log.append(line)
        self.outcomes[plan.agent_id] = line
        self.progress.agent(plan.agent_id, AgentState(line.outcome), detail=line.detail)


async def _unless(load: Coroutine[Any, Any, LoadOutcome], stop: asyncio.Event) -> LoadOutcome | None:
    """``load``'s outcome, or None when ``stop`` is set first: then it is cancelled like a --stop-after with no
    grace (its cleanup cancels and awaits every agent; a turn cut short is not committed, so it is sent again on
    resume)."""
    task, waiter = asyncio.ensure_future(load), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, waiter, return_exceptions=True)
    return None if task.cancelled() else task.result()


class _FleetAgent(ConversationDriver[FleetContext]):
    """One fleet agent: a ``ConversationDriver`` of its own conversations, plus the hooks ``Gated`` calls.

    Its task is a ``ToolConversation`` from its committed turns (``resume``), with the checkpoint as its ``on_turn``
    hook; the loop sends its turns through the context's ``FleetBackend`` (parking, the limiter's feed), which
    ``begin`` starts afresh for each attempt. A restart cancels the driver's task with ``RESTART`` while the
    conversation is in flight; the cancel is raised here, at the ``yield``, taken back, and the conversation
    yielded again from the committed turns. ``AgentStopped`` (a stop at a turn boundary) is raised here too, and
    holds the agent.

    The ``Gated`` strategy calls the hooks in this order: ``announce``, (dependencies done) ``ready``, (the gate
    lets it in) ``run``, (its slot given back) ``done``. A failed or skipped dependency skips it; an agent that
    finished in an earlier segment is ``settled`` and only reports its outcome.
    """

    def __init__(self, runner: FleetRunner, plan: AgentPlan) -> None:
        self.runner = runner
        self.plan = plan
        self.agent_id = plan.agent_id
        super().__init__(self)
        self.settled = plan.agent_id in runner.outcomes  # finished in an earlier segment (fixed for this one)
        self._dep_results: dict[str, str] = {}
        self._line: AgentLine | None = None

    @property
    def group(self) -> str:
        return self.plan.task_id

    @property
    def depends_on(self) -> Sequence[str]:
        return self.plan.depends_on

    def announce(self) -> None:
        r, aid = self.runner, self.agent_id
        rounds = len(r.state.turns.get(aid, []))
        if self.settled:
            r.progress.agent(aid, AgentState(r.outcomes[aid].outcome), rounds=rounds)
        else:
            r.progress.agent(aid, AgentState.WAITING, rounds=rounds)

    async def ready(self) -> bool:
        r, aid = self.runner, self.agent_id
        rounds = len(r.state.turns.get(aid, []))
        if aid in r.stopping:
            r.hold(aid, rounds, "stopped before it started; resumable")
            return False
        results: dict[str, str] = {}
        for dep in self.plan.depends_on:
            for p in self.runner.by_task[dep]:
                if p.agent_id in r.held:  # not failed, not done: it may finish on resume, and this one after it
                    r.hold(aid, rounds, f"dependency {p.agent_id} was stopped; resumable")
                    return False
                line = self.runner.outcomes.get(p.agent_id)
                if line is None or line.outcome != "done":
                    why = "failed" if line is not None and line.outcome == "failed" else "was skipped"
                    skipped = AgentLine(agent=self.agent_id, outcome="skipped", detail=f"dependency {p.agent_id} {why}")
                    await self.runner.record(self.plan, skipped)
                    return False
                results[p.agent_id] = line.final_content[:DEPENDENCY_RESULT_CHARS]
        self._dep_results = results
        return True

    def priority(self) -> tuple[int, ...]:
        # Agents with committed turns first (their context is paid for), then by wave and order.
        return (0 if self.runner.state.committed(self.agent_id) else 1, self.plan.wave, self.plan.index)

    def conversations(self, ctx: FleetContext) -> Steps:
        r, plan, aid = self.runner, self.plan, self.agent_id
        committed = r.state.committed(aid)
        if aid in r.stopping:  # stopped while it waited for a slot
            r.hold(aid, len(committed), "stopped before it started; resumable")
            return
        prior = r.state.elapsed(aid)
        started = r.clock.now()
        dep_results = self._dep_results
        r.progress.agent(aid, AgentState.RUNNING, rounds=len(committed))
        # The dependencies' files, copied into this agent's own workspace (fleet/handoff.py).
        handed = hand_over(r.workspaces, aid, dep_results) if dep_results and "read_file" in plan.tools else []
        spec = plan.spec(r.model, dep_results, handed)
        searches = sum(1 for t in committed if t.assistant for c in t.final.tool_calls if c.name == "search")
        tools = build_registry(
            plan.tools,
            ToolSettings(aid, r.workspaces / aid, plan.tool_result_tokens, plan.tool_latency_s, searches),
        )
        on_turn = CheckpointHook(r, aid, prior, started, committed, max_rounds=spec.max_rounds,
                                 server_dead=r.server_dead)  # fmt: skip
        task = asyncio.current_task()  # the driver's: a restart cancels it while the conversation is in flight
        assert task is not None
        rejoin: tuple[int, ...] | None = None
        while True:
            # One attempt of the agent from its committed turns; a restart cancels it and comes round again.
            previous = next((t.final for t in reversed(committed) if t.final.ok), None)
            ctx.backend.begin(plan, previous, rejoin)
            conversation = ToolConversation(spec, tools, r.clock, run_id=r.run_id, on_turn=on_turn,
                                            resume=list(committed))  # fmt: skip
            r.attempts[aid] = task
            try:
                ending = yield conversation
            except asyncio.CancelledError as cancel:
                # Only this agent's restart is taken back: the run's own cancel (alone, or with it) ends the agent.
                if cancel.args != (RESTART,) or aid not in r.restarting or task.cancelling() != 1:
                    raise
                task.uncancel()
                r.restarting.discard(aid)
                rejoin = self.priority()  # restarted while parked, it gave its slot back: it queues again first
                if r.limiter.gate.is_live(aid):
                    r.progress.agent(aid, AgentState.RUNNING, rounds=len(committed))
                continue
            except AgentStopped:
                r.hold(aid, len(committed), f"stopped after {len(committed)} committed turns; resumable")
                return
            finally:
                r.attempts.pop(aid, None)
            break
        # A restart whose cancel the client's timeout guard took for its own (uncancel() in the same tick) was a
        # no-op: the attempt went on. Forget it (only a cancel carrying ``RESTART`` is ever taken back, so the run's
        # own cancel can never be mistaken for it).
        r.restarting.discard(aid)
        assert ending is not None  # the driver sends a conversation's ending back
        transcript = conversation.finish(ending)
        outcome = "failed" if transcript.stop_reason == "failed" else "done"
        detail = ""
        if outcome == "failed" and transcript.turns:
            final = transcript.turns[-1].final
            detail = f"{final.outcome.value}: {final.error_message}"[:300]
        self._line = AgentLine(
            agent=aid,
            outcome=outcome,
            stop_reason=transcript.stop_reason,
            elapsed_s=prior + r.clock.now() - started,
            final_content=transcript.final_content,
            detail=detail,
        )

    async def done(self) -> None:
        if self._line is None:  # held (stopped): no outcome, so a resume runs it
            return
        await self.runner.record(self.plan, self._line)
