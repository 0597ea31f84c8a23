"""What the dashboard's buttons do to a running fleet, each through the path the fleet already has for it.

* **pause / resume** — while paused, each agent's next turn waits in ``FleetControl.hold`` (the fleet's backend
  asks it before a request is sent), so no new turn starts and the turns in flight finish (and are committed) as
  usual. Nothing is checkpointed by a pause because nothing is lost by one.
* every action but the width is also written to the run's log as a ``ControlLine`` (not fsynced: the next turn's
  commit flushes it), so ``agentload dashboard RUN`` replays the pauses and the stops; a failed write of it loses
  only that, and the action is taken.
* **stop** — sets the event ``FleetRunner`` races its load against (``stop=``): the load is cancelled as
  ``--stop-after`` cancels it, the turns cut short are not committed, and ``agentload run --resume`` sends them
  again — the same checkpointed path as a kill.
* **stop / restart one agent** — ``FleetRunner.stop_agent`` (it ends at its next turn boundary: the turn in
  flight is committed, the agent gets no outcome line and stays resumable) and ``restart_agent`` (its turn in
  flight is cancelled uncommitted and it runs again from its last committed turn); an agent waiting at the pause
  is stopped there, before its turn is sent.
* **width** — replaces the limiter's policy (``fleet.limiter.make_policy``: sequential, parallel N, auto from
  the current width) and moves its gate, logged as a ``LimitLine`` like any change the limiter makes; a
  narrower width parks agents at their next turn boundary as the adaptive limiter's own narrowing does.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from agentload.clock import Clock
from agentload.dashboard.state import LiveState
from agentload.errors import CheckpointError, ConfigError
from agentload.fleet.checkpoint import CheckpointLog, ControlAction, ControlLine, LimitLine
from agentload.fleet.limiter import LimitChange, Limiter, Mode, make_policy
from agentload.fleet.turns import FleetProgress


class Run(Protocol):
    """What the controls reach of the running fleet (``fleet.runner.FleetRunner`` fits)."""

    limiter: Limiter
    log: CheckpointLog
    progress: FleetProgress
    segment: int
    t0: float
    stopping: set[str]

    def stop_agent(self, agent: str) -> None: ...

    def restart_agent(self, agent: str) -> None: ...


class FleetControl:
    """Pause, resume, stop and width for one run; ``attach`` the runner once it exists."""

    def __init__(self, state: LiveState, clock: Clock, *, max_width: int) -> None:
        self.state = state
        self.clock = clock
        self.max_width = max_width
        self.running = asyncio.Event()  # clear while paused
        self.running.set()
        self.stop = asyncio.Event()
        self.pauses: list[tuple[float, float | None]] = []  # (paused, resumed) on the run's clock
        self.run: Run | None = None

    def attach(self, run: Run) -> None:
        self.run = run
        # Asked for before the runner existed (the page serves from the start): recorded now, at the run's start.
        if self.paused:
            self._record("pause")
        if self.stop.is_set():
            self._record("stop")

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    def pause(self) -> None:
        if self.paused:
            return
        self.running.clear()
        self.pauses.append((self.clock.now(), None))
        self.state.control_changed(paused=True)
        self._record("pause")

    def resume(self) -> None:
        if not self.paused:
            return
        start, _ = self.pauses[-1]
        self.pauses[-1] = (start, self.clock.now())
        self.running.set()
        self.state.control_changed(paused=False)
        self._record("resume")

    def request_stop(self) -> None:
        if not self.stop.is_set():
            self._record("stop")
        self.stop.set()
        self.state.control_changed(stopping=True)

    def _record(self, action: ControlAction, agent: str | None = None) -> None:
        """The action in the run's log, for the replay (none before the run started: it has no turns to show)."""
        run = self.run
        if run is None:
            return
        # A failed write loses only the replay's record of it; the next turn's commit meets the same disk and stops
        # the run with its own error if it is still failing.
        with contextlib.suppress(CheckpointError):
            run.log.write(ControlLine(segment=run.segment, t=self.clock.now(), action=action, agent=agent))

    def _run_for(self, agent: str) -> Run:
        if agent not in self.state.cards:
            raise ConfigError(f"no agent {agent!r} in this fleet")
        if self.run is None:
            raise ConfigError("the run has not started yet")
        return self.run

    def stop_agent(self, agent: str) -> None:
        run = self._run_for(agent)
        again = agent in run.stopping
        run.stop_agent(agent)
        self.state.agent_control(agent, stopping=True)
        if not again:
            self._record("stop_agent", agent)

    def restart_agent(self, agent: str) -> None:
        self._run_for(agent).restart_agent(agent)
        self.state.agent_control(agent, restarted=True)
        self._record("restart_agent", agent)

    async def hold(self, agent: str) -> None:
        """Where a turn waits while paused, before its request is sent (``fleet.turns.FleetBackend`` calls it when
        ``paused``, and stops an agent stopped meanwhile right after): the turn has not started, so nothing is lost.
        A loop, not one wait: a resume and a new pause handled before this task wakes leave the run paused again,
        and the turn must keep waiting."""
        while self.paused:
            await self.running.wait()

    async def set_width(self, mode: Mode, width: int | None) -> LimitChange:
        """Switch the limiter to ``mode`` (at ``width`` for parallel; from ``width`` or the current one for auto)."""
        run = self.run
        if run is None:
            raise ConfigError("the run has not started yet")
        limiter = run.limiter
        old = limiter.limit
        if mode is Mode.SEQUENTIAL:
            if width not in (None, 1):
                raise ConfigError("sequential runs one agent at a time; give no width")
            width = 1
        elif mode is Mode.PARALLEL and width is None:
            raise ConfigError("parallel needs a width")
        width = old if width is None else width
        if not 1 <= width <= self.max_width:
            raise ConfigError(
                f"the width must be between 1 and {self.max_width} (--max-width or the fleet's agents), got {width}"
            )
        policy = make_policy(mode, width, max_width=self.max_width)
        new = policy.initial()
        label = mode.value if mode is not Mode.PARALLEL else f"parallel {width}"
        change = LimitChange(t=self.clock.now() - run.t0, old=old, new=new, reason=f"set from the dashboard: {label}")
        # Logged before it takes effect: a width the checkpoint log does not have never runs (a failed write is
        # raised from here, the page gets a 500, and the width stays as it was).
        await run.log.append(
            LimitLine(
                segment=run.segment,
                change=change,
                mode=mode,
                min_limit=policy.min_limit,
                max_limit=policy.max_limit,
            )
        )
        limiter.policy = policy
        limiter.history.append(change)
        limiter.gate.set_limit(new)
        run.progress.limiter(limiter.statistics())
        return change
