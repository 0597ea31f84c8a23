"""What ``agentload bench`` shows of a run as it goes: a line on the console for each level, and with
``--dashboard`` the live page (``dashboard.bench``); both are observers of the run (``bench.observe``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape

from agentload.bench.analysis import LevelData
from agentload.bench.observe import BenchObserver, Observers, Unobserved
from agentload.bench.results import LevelSummary, RunResult
from agentload.bench.search import SearchStep
from agentload.bench.session import BenchSession
from agentload.bench.settings import BenchSettings
from agentload.cli.common import console, err_console
from agentload.clock import LoopClock
from agentload.dashboard.bench import BenchBoard, open_bench_board
from agentload.endpoint.connection import Connection
from agentload.errors import ConfigError
from agentload.report.console import print_result
from agentload.report.text import replays_trace
from agentload.store.benchrun import BenchRecorder


class ConsoleLines(Unobserved):
    """What the console shows of a bench as it runs: notes, and a line for each level as it ends (on stderr)."""

    def opened(self, settings: BenchSettings, recorder: BenchRecorder) -> None:
        """The run's header line (and what a resumed run kept)."""
        if not recorder.fresh:
            kept = f"{len(recorder.resumed.levels)} finished level(s) kept"
            aside = f"; the interrupted level's {recorder.moved} record(s) moved to records.interrupted.jsonl"
            self.note(f"resuming {recorder.path}: {kept}{aside if recorder.moved else ''}")
        # A trace's sessions are the sizes it recorded: --context sizes nothing there (its realised context is said
        # per level and in the capacity estimate).
        contexts = (
            "context the trace's own"
            if replays_trace(settings.workload.strip())
            else f"contexts {', '.join(f'{c:,}' for c in settings.contexts)}"
        )
        err_console.print(
            f"[bold]agentload bench[/] {escape(settings.target)} · workload {escape(settings.workload)} · "
            f"{settings.mode} · {contexts} · run {recorder.run_id}"
        )

    def finished(self, result: RunResult, saved: Path, json_out: bool) -> None:
        """The result on stdout: as JSON, or the level tables and the panel and where it was saved."""
        if json_out:
            console.print_json(result.model_dump_json())
            return
        print_result(result, console)
        where_saved = escape(str(saved))
        # Soft-wrapped: a path broken across lines at the console's width cannot be copied back into a command.
        console.print(f"[dim]saved {where_saved} · `agentload report {where_saved}` renders it[/]", soft_wrap=True)

    def note(self, text: str) -> None:
        err_console.print(text, markup=False, soft_wrap=True, style="dim")

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        s, hit, ttft = summary, summary.prefix_hit_rate_effective, summary.ttft_s.p50  # both tiers' reuse in hit
        ctx = "-" if s.context_mean is None else f"{s.context_mean:,.0f}"
        out = "-" if s.output_ratio is None else f"{s.output_ratio:.0%}"
        sized = "trace sizes" if replays_trace(s.workload) else f"{s.context:,} tokens"
        err_console.print(
            f"[dim]level {s.level}:[/] {s.agents:>4} agents × {sized} (server {ctx}) → "
            f"{s.output_tps:8.1f} out tok/s  {s.turns} turns{' [red](too few)[/]' if s.too_few_turns else ''}"
            f"  output {out} of asked  prefix hit {'-' if hit is None else f'{hit:.0%}'}"
            f"  TTFT p50 {'-' if ttft is None else f'{ttft:.2f}s'}  preemptions {s.preemptions or 0:.0f}"
        )
        for w in s.warnings:
            err_console.print(f"  [yellow]warning:[/] {escape(w)}")


class BoardView(Unobserved):
    """The live page hears the level's start, its connection, each request, each level and each search step."""

    def __init__(self, board: BenchBoard) -> None:
        super().__init__()
        self.board = board
        self.record = board.record

    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None:  # fmt: skip
        self.board.level_started(level, agents, context, workload, warmup_s, window_s)

    def connected(self, conn: Connection) -> Callable[[], None]:
        return self.board.connected(conn)

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        self.board.level_done(summary)

    def step(self, step: SearchStep) -> None:
        self.board.step(step)


class NothingRan(ConfigError):
    """The dashboard could not start (its port in use): the run never began."""


async def measure_shown(session: BenchSession, recorder: BenchRecorder, shown: ConsoleLines, port: int | None,
                   interval_s: float | None) -> tuple[RunResult, list[LevelData]]:  # fmt: skip
    """Measure the session, heard by the run store first (a level is on disk before it is shown), the console, and
    on ``port`` the live page (a port in use is ``NothingRan``: no level was measured)."""
    observers: list[BenchObserver] = [recorder, shown]
    async with contextlib.AsyncExitStack() as stack:
        if port is not None:
            meta = {"mode": session.settings.mode, "target": session.settings.target,
                    "workload": session.settings.workload, "run_id": recorder.run_id}  # fmt: skip
            try:
                board = await stack.enter_async_context(
                    open_bench_board(LoopClock(), meta, port=port, interval_s=interval_s)
                )
            except ConfigError as exc:
                raise NothingRan(str(exc)) from exc
            err_console.print(f"dashboard: {board.url}", markup=False, soft_wrap=True)
            observers.append(BoardView(board))
        return await session.measure(Observers(observers), run_id=recorder.run_id, resumed=recorder.resumed)
