"""Live progress of a fleet: one row per agent (state, round, tokens, last output) and the limiter's width.

``LiveProgress`` draws with rich on a terminal; ``LineProgress`` prints one line per finished agent and per
width change (logs, CI, pipes). Both only accumulate what the runner reports; nothing here feeds back into it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agentload.agent.loop import TurnLog
from agentload.fleet.limiter import LimiterStatistics
from agentload.fleet.runner import AgentState

_STYLE = {
    AgentState.WAITING: "dim",
    AgentState.RUNNING: "cyan",
    AgentState.PARKED: "yellow",
    AgentState.INTERRUPTED: "bright_red",
    AgentState.DONE: "green",
    AgentState.FAILED: "red",
    AgentState.SKIPPED: "magenta",
    AgentState.STOPPED: "bright_black",
}
# Rows shown at once: live agents first, then the most recently finished, then the waiting.
MAX_ROWS = 24


@dataclass
class _Row:
    state: AgentState = AgentState.WAITING
    rounds: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last: str = ""
    changed: int = 0  # update counter, to show the most recent first


class _Board:
    def __init__(self, agents: list[str]) -> None:
        self.rows = {a: _Row() for a in agents}
        self.stats: LimiterStatistics | None = None
        self._tick = 0

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        row = self.rows.setdefault(agent, _Row())
        row.state = state
        if rounds is not None:
            row.rounds = rounds
        if detail:
            row.last = detail
        self._tick += 1
        row.changed = self._tick

    def turn(self, agent: str, turn: TurnLog) -> None:
        row = self.rows.setdefault(agent, _Row())
        final = turn.final
        row.rounds = turn.round + 1
        row.prompt_tokens = final.prompt_tokens
        row.completion_tokens += final.completion_tokens
        if final.tool_calls:
            row.last = "→ " + ", ".join(f"{c.name}({c.arguments[:40]})" for c in final.tool_calls)
        elif final.content:
            row.last = final.content
        elif not final.ok:
            row.last = f"{final.outcome.value}: {final.error_message}"
        self._tick += 1
        row.changed = self._tick

    def summary(self) -> str:
        counts = Counter(r.state for r in self.rows.values())
        order = (AgentState.RUNNING, AgentState.PARKED, AgentState.WAITING, AgentState.INTERRUPTED, AgentState.DONE,
                 AgentState.FAILED, AgentState.SKIPPED, AgentState.STOPPED)  # fmt: skip
        parts = [f"{counts[s]} {s.value}" for s in order if counts.get(s)]
        width = ""
        if self.stats is not None:
            width = f"  width {self.stats.limit} ({self.stats.mode.value}, {len(self.stats.history)} changes)"
        return " · ".join(parts) + width

    def render(self) -> RenderableType:
        table = Table(box=None, pad_edge=False, expand=False)
        for col in ("agent", "state", "round", "context", "out", "last output"):
            table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=60 if col == "last output" else None)
        order = {AgentState.RUNNING: 0, AgentState.PARKED: 1, AgentState.FAILED: 2, AgentState.DONE: 3}
        rows = sorted(self.rows.items(), key=lambda kv: (order.get(kv[1].state, 4), -kv[1].changed))
        for agent, row in rows[:MAX_ROWS]:
            table.add_row(
                agent,
                Text(row.state.value, style=_STYLE[row.state]),
                str(row.rounds),
                f"{row.prompt_tokens:,}",
                f"{row.completion_tokens:,}",
                row.last.replace("\n", " ")[:60],
            )
        hidden = len(rows) - MAX_ROWS
        footer = Text(self.summary() + (f"  (+{hidden} more)" if hidden > 0 else ""), style="bold")
        return Group(table, footer)


class LiveProgress:
    """A rich Live board, refreshed a few times a second; use as a context manager."""

    def __init__(self, agents: list[str], console: Console) -> None:
        self.board = _Board(agents)
        self._live = Live(console=console, refresh_per_second=4, transient=False, get_renderable=self.board.render)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        self.board.agent(agent, state, rounds=rounds, detail=detail)

    def turn(self, agent: str, turn: TurnLog) -> None:
        self.board.turn(agent, turn)

    def limiter(self, stats: LimiterStatistics) -> None:
        self.board.stats = stats


class LineProgress:
    """Plain lines: an agent that ends, a width that changes."""

    def __init__(self, agents: list[str], console: Console) -> None:
        self.board = _Board(agents)
        self.console = console

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        before = self.board.rows.get(agent)
        was = before.state if before is not None else None
        self.board.agent(agent, state, rounds=rounds, detail=detail)
        ended = (AgentState.DONE, AgentState.FAILED, AgentState.SKIPPED, AgentState.INTERRUPTED, AgentState.STOPPED)
        if state in ended and was != state:
            row = self.board.rows[agent]
            self.console.print(
                f"{state.value:>7} {agent}: {row.rounds} rounds, context {row.prompt_tokens:,} tokens"
                + (f" — {row.last[:80]}" if state is not AgentState.DONE and row.last else ""),
                markup=False,
            )

    def turn(self, agent: str, turn: TurnLog) -> None:
        self.board.turn(agent, turn)

    def limiter(self, stats: LimiterStatistics) -> None:
        self.board.stats = stats
        if stats.history:
            c = stats.history[-1]
            self.console.print(f"  width {c.old} → {c.new} at {c.t:.0f} s: {c.reason}", markup=False)
