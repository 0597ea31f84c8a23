"""The live dashboard of a bench run (``agentload bench --url … --dashboard``): the same state, server and page.

A bench has no fleet cards and no controls; what it shows is the server's timelines (the level's connection's one
``/metrics`` monitor, as for a fleet), the level running, the level table filling in as each level's summary is
compiled, and the knee search's steps. ``BenchBoard`` is what ``bench.orchestrate.run_bench`` tells (its
``BenchWatch``) plus the two hooks the bench command already has: each level's summary and each request's record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from agentload.bench.results import LevelSummary
from agentload.bench.search import SearchStep
from agentload.clock import Clock
from agentload.dashboard.control import FleetControl
from agentload.dashboard.server import Dashboard
from agentload.dashboard.state import BenchView, LiveState, level_row
from agentload.endpoint.connection import Connection
from agentload.endpoint.records import RequestRecord


class BenchBoard:
    """A bench run's live page; see the module docstring."""

    def __init__(self, state: LiveState, server: Dashboard) -> None:
        self.state = state
        self.server = server
        self.url = ""

    # -- bench.orchestrate.BenchWatch ----------------------------------------------------------------------------
    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None:  # fmt: skip
        assert self.state.bench is not None
        self.state.bench.current = {"level": level, "agents": agents, "context": context, "workload": workload,
                                    "warmup_s": warmup_s, "window_s": window_s,
                                    "t": round(self.state.clock.now() - self.state.t0, 3)}  # fmt: skip
        self.state.touch()

    def connected(self, conn: Connection) -> Callable[[], None]:
        self.state.watchdog = conn.watchdog.statistics
        return conn.monitor.subscribe(self.state.on_scrape)

    def step(self, step: SearchStep) -> None:
        assert self.state.bench is not None
        self.state.bench.steps.append(asdict(step))
        self.state.touch()

    # -- the bench command's own hooks ---------------------------------------------------------------------------
    def level_done(self, summary: LevelSummary) -> None:
        assert self.state.bench is not None
        self.state.bench.levels.append(level_row(summary))
        self.state.bench.current = None
        self.state.touch()

    def record(self, record: RequestRecord) -> None:
        self.state.record(record)


@asynccontextmanager
async def open_bench_board(
    clock: Clock, meta: dict[str, Any], *, port: int = 0, interval_s: float | None = None
) -> AsyncIterator[BenchBoard]:
    """A bench's page serving on 127.0.0.1 for the block (no controls: ``POST /api/control`` is a 405)."""
    state = LiveState([], clock, fleet=str(meta.get("workload", "")), run_id=str(meta.get("run_id", "")))
    state.bench = BenchView(meta)
    control = FleetControl(state, clock, max_width=1)  # never attached: the page and the API offer no controls
    board = BenchBoard(state, Dashboard(state, control, port=port, interval_s=interval_s, controls=False))
    board.url = await board.server.start()
    try:
        yield board
    finally:
        state.finished = True
        state.touch()
        await board.server.close()
