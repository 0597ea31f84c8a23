"""The live dashboard of a fleet run (``agentload run FLEET.toml --dashboard``): state, controls, page, server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from agentload.clock import Clock
from agentload.dashboard.control import FleetControl, Run
from agentload.dashboard.server import Dashboard
from agentload.dashboard.state import LiveState, Tee, WatchdogView
from agentload.endpoint.client import stream_watch
from agentload.endpoint.signals import SignalPoller
from agentload.fleet.config import AgentPlan
from agentload.fleet.turns import FleetProgress


@dataclass
class Board:
    """A dashboard for one run, serving from the start: ``connect`` the server's monitor, wrap the run's progress,
    ``start`` it with the runner (controls that need the runner answer 400 until then; the runner's ``pause`` is
    the board's ``control``), and run the runner ``watching``."""

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

    @contextmanager
    def watching(self) -> Iterator[None]:
        """For the run inside the block: every request its agents send is handed to the live state as it starts
        (``endpoint.client.stream_watch``, set once here and inherited by the agents' tasks)."""
        token = stream_watch.set(self.state.stream_started)
        try:
            yield
        finally:
            stream_watch.reset(token)

    def progress(self, inner: FleetProgress | None) -> Tee:
        return Tee(self.state, inner)

    def start(self, run: Run) -> None:
        self.control.attach(run)
        self.state.limiter_view = run.limiter.statistics
        self.state.limiter_changed(run.limiter.statistics())


@asynccontextmanager
async def open_board(
    plans: Sequence[AgentPlan],
    clock: Clock,
    *,
    max_width: int,
    port: int = 0,
    fleet: str = "",
    interval_s: float | None = None,
) -> AsyncIterator[Board]:
    """A board serving on 127.0.0.1 for the block (a port in use is a ``ConfigError`` before anything starts);
    on the way out the page is told the run ended and the server closes."""
    state = LiveState(plans, clock, fleet=fleet)
    control = FleetControl(state, clock, max_width=max_width)
    board = Board(state, control, Dashboard(state, control, port=port, interval_s=interval_s))
    board.url = await board.server.start()
    try:
        yield board
    finally:
        if board._unsubscribe is not None:
            board._unsubscribe()
        state.finish()
        state.control_changed(paused=False)
        await board.server.close()
