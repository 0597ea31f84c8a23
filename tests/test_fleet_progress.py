"""The progress displays: the live board's rows and summary, and the plain lines for logs and pipes."""

from __future__ import annotations

import io

from rich.console import Console

from agentload.agent.loop import TurnLog
from agentload.endpoint.records import ErrorKind, Outcome, RequestRecord, ToolCallRecord
from agentload.fleet.limiter import LimitChange, LimiterStatistics, Mode
from agentload.fleet.progress import MAX_ROWS, LineProgress, LiveProgress
from agentload.fleet.runner import AgentState


def _console() -> Console:
    return Console(file=io.StringIO(), width=140, record=True, color_system=None)


def _turn(rnd: int, **record: object) -> TurnLog:
    return TurnLog(round=rnd, records=[RequestRecord(t_sent=0.0, t_done=1.0, **record)])


def _stats(history: list[LimitChange]) -> LimiterStatistics:
    return LimiterStatistics(
        mode=Mode.AUTO, limit=5, min_limit=1, max_limit=9, live=5, queued=2, parked_total=0, decisions=3,
        history=history,
    )  # fmt: skip


def test_the_board_shows_live_agents_first_with_their_last_output() -> None:
    console = _console()
    agents = [f"a{i}" for i in range(MAX_ROWS + 6)]
    progress = LiveProgress(agents, console)
    call = ToolCallRecord(id="c", name="search", arguments='{"query": "cache"}')
    progress.turn("a1", _turn(2, prompt_tokens=8123, completion_tokens=7, tool_calls=[call]))
    progress.agent("a1", AgentState.RUNNING)
    progress.turn("a2", _turn(0, outcome=Outcome.TIMEOUT, error=ErrorKind.IDLE_TIMEOUT, error_message="idle 60 s"))
    progress.agent("a2", AgentState.FAILED)
    progress.turn("a3", _turn(4, prompt_tokens=900, content="All modules reviewed."))
    progress.agent("a3", AgentState.DONE)
    progress.limiter(_stats([LimitChange(t=3, old=4, new=5, reason="widen: clean")]))
    console.print(progress.board.render())
    text = console.export_text()
    rows = [line for line in text.splitlines() if line.startswith("a")][1:]  # under the header row
    assert rows[0].split()[:5] == ["a1", "running", "3", "8,123", "7"]
    assert 'search({"query": "cache"})' in rows[0]
    assert rows[1].split()[:2] == ["a2", "failed"]
    assert "timeout: idle 60 s" in rows[1]
    assert rows[2].split()[:2] == ["a3", "done"]
    assert len(rows) == MAX_ROWS
    assert "1 running · 27 waiting · 1 done · 1 failed" in text
    assert "width 5 (auto, 1 changes)" in text
    assert "(+6 more)" in text


def test_plain_lines_for_finished_agents_and_width_changes() -> None:
    console = _console()
    progress = LineProgress(["a", "b"], console)
    progress.agent("a", AgentState.RUNNING)
    progress.turn("a", _turn(1, prompt_tokens=1500, content="ok"))
    progress.agent("a", AgentState.DONE)
    progress.agent("a", AgentState.DONE)  # reported once
    progress.agent("b", AgentState.SKIPPED, detail="dependency x failed")
    progress.limiter(_stats([LimitChange(t=12.4, old=8, new=6, reason="narrow: 3.0 requests waiting")]))
    lines = console.export_text().splitlines()
    assert lines == [
        "   done a: 2 rounds, context 1,500 tokens",
        "skipped b: 0 rounds, context 0 tokens — dependency x failed",
        "  width 8 → 6 at 12 s: narrow: 3.0 requests waiting",
    ]
