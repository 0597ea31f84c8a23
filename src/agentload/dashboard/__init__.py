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
    """A dashboard for one run, serving from the start: ``connect`` the server's monitor, wrap the run's backend
    and progress, then ``start`` it with the runner (controls that need the runner answer 400 until then)."""

    state: LiveState
    control: FleetControl
    server: Dashboard
    url: str = ""
    _unsubscribe: Callable[[], None] | None = None

    def connect(self, monitor: SignalPoller, watchdog: Callable[[], WatchdogView] | None, run_id: str) -> None:
        """Feed the timelines from the connection's one monitor (no second poller) and show the watchdog."""
        self._unsubscribe = monitor.subscribe(self.state.on_scrape)
        self.state.watchdog = watchdog
        self.state.run_id = run_id

    def backend(self, inner: ChatBackend) -> WatchedBackend:
        return WatchedBackend(inner, self.state, self.control)

    def progress(self, inner: FleetProgress | None) -> Tee:
        return Tee(self.state, inner)

    def start(self, run: Run) -> None:
        self.control.attach(run)
        self.state.limiter_changed(run.limiter.statistics())


@asynccontextmanager
async def open_board(
    plans: Sequence[AgentPlan], clock: Clock, *, max_width: int, port: int = 0, fleet: str = ""
) -> AsyncIterator[Board]:
    """A board serving on 127.0.0.1 for the block (a port in use is a ``ConfigError`` before anything starts);
    on the way out the page is told the run ended and the server closes."""
    state = LiveState(plans, clock, fleet=fleet)
    control = FleetControl(state, clock, max_width=max_width)
    board = Board(state, control, Dashboard(state, control, port=port))
    board.url = await board.server.start()
    try:
        yield board
    finally:
        if board._unsubscribe is not None:
            board._unsubscribe()
        state.finished = True
        state.control_changed(paused=False)
        await board.server.close()
