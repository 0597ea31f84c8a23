"""The live dashboard of a fleet run (``agentload run FLEET.toml --dashboard``): state, controls, page, server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from agentload.agent.loop import ChatBackend
from agentload.clock import Clock
from agentload.dashboard.control import FleetControl, Run, WatchedBackend
from agentload.dashboard.server import Dashboard
from agentload.dashboard.state import LiveState, Tee, WatchdogView
from agentload.endpoint.signals import SignalPoller
from agentload.fleet.config import AgentPlan
from agentload.fleet.turns import FleetProgress


@dataclass
class Board:
    """A dashboard attached to one run: wrap the run's backend and progress with it, then ``start`` it."""

    state: LiveState
    control: FleetControl
    server: Dashboard
    url: str = ""

    def backend(self, inner: ChatBackend) -> WatchedBackend:
        return WatchedBackend(inner, self.state, self.control)

    def progress(self, inner: FleetProgress | None) -> Tee:
        return Tee(self.state, inner)

    async def start(self, run: Run) -> str:
        self.control.attach(run)
        self.state.limiter_changed(run.limiter.statistics())
        self.url = await self.server.start()
        return self.url


@asynccontextmanager
async def open_board(
    plans: Sequence[AgentPlan],
    clock: Clock,
    *,
    monitor: SignalPoller | None,
    watchdog: Callable[[], WatchdogView] | None = None,
    max_width: int,
    port: int = 0,
    fleet: str = "",
    run_id: str = "",
) -> AsyncIterator[Board]:
    """A board for the block; its server (once started) is closed on the way out, the page told the run ended."""
    state = LiveState(plans, clock, fleet=fleet, run_id=run_id)
    state.watchdog = watchdog
    control = FleetControl(state, clock, max_width=max_width)
    board = Board(state, control, Dashboard(state, control, port=port))
    unsubscribe = monitor.subscribe(state.on_scrape) if monitor is not None else None
    try:
        yield board
    finally:
        if unsubscribe is not None:
            unsubscribe()
        state.finished = True
        state.control_changed(paused=False)
        await board.server.close()
