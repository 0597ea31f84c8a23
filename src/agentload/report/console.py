"""The terminal view of saved runs (rich): a run's levels, knee and capacity; the run history as a table.

It shows the same cells and sentences as the HTML report (``report.levels``, ``report.text``), so the two never
disagree. The level table is folded into parts that fit the console's width — a terminal's, or off a terminal
``$COLUMNS`` (else rich's 80) — so a pipe, a file or a CI log is as wide as it was asked to be: no cell is ever cut
to "…".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentload.bench.results import RunResult
from agentload.report.levels import LevelTable, level_table
from agentload.report.text import DASH, capacity_sentence, evidence_text, knee_sentence, num, synthetic_lines
from agentload.store.history import HistoryEntry

UNBOUNDED = 10_000  # columns to measure a table in, wider than any table we print


def _table(result: RunResult, lt: LevelTable, columns: Sequence[int], *, title: bool) -> Table:
    heading = " · ".join([result.run_id, result.model, result.workload, *lt.constants]) if title else None
    out = Table(title=heading, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for i in columns:
        # "fold", not the default ellipsis: a cell too wide for a tiny terminal breaks onto a second line rather
        # than losing its digits to "…".
        out.add_column(lt.headers[i], justify="left" if i == 0 else "right", no_wrap=True, overflow="fold")
    for row, is_knee in zip(lt.rows, lt.knee_rows, strict=True):
        out.add_row(*(row[i] for i in columns), style="bold yellow" if is_knee else None)
    return out


def levels_table(result: RunResult, lt: LevelTable | None = None) -> Table:
    """All the columns in one table (the width a pipe or a CI log gets)."""
    lt = lt or level_table(result, fold_constant=True)
    return _table(result, lt, range(len(lt.headers)), title=True)


def _width(console: Console, table: Table) -> int:
    return Measurement.get(console, console.options.update_width(UNBOUNDED), table).maximum


def folded_tables(result: RunResult, console: Console, lt: LevelTable | None = None) -> list[Table]:
    """The table in parts that each fit the terminal, ``agents`` first in every part.

    One part when everything fits; else the core columns (``Column.core``: load, throughput, prefix hit, TTFT,
    KV, preemptions) come first and the rest follow, each group packed greedily, in table order, into parts no
    wider than the console, measured by rendering. Dropping columns instead would hide the one a reader came for.
    """
    lt = lt or level_table(result, fold_constant=True)
    every = list(range(len(lt.headers)))
    if _width(console, _table(result, lt, every, title=False)) <= console.width:
        return [_table(result, lt, every, title=True)]
    groups = [[i for i in every[1:] if lt.core[i]], [i for i in every[1:] if not lt.core[i]]]
    parts: list[list[int]] = []
    for group in groups:
        part: list[int] = []
        for i in group:
            if part and _width(console, _table(result, lt, [0, *part, i], title=False)) > console.width:
                parts.append(part)
                part = []
            part.append(i)
        if part:
            parts.append(part)
    return [_table(result, lt, [0, *part], title=n == 0) for n, part in enumerate(parts)]


class NaturalWidth:
    """A renderable drawn as wide as it wants, whatever the console's width.

    Off a terminal rich assumes 80 columns and squeezes a wide table into "…"; a file or a CI log has no width,
    so the table keeps all its digits and the reader's viewer scrolls. Print it with ``crop=False``.
    """

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = Measurement.get(console, options.update_width(UNBOUNDED), self.table).maximum
        yield from console.render(self.table, options.update_width(width))


def _notes(lt: LevelTable) -> Iterator[Text]:
    for warning in lt.warnings:
        yield Text(f"warning: {warning}", style="yellow")
    for line in lt.legend:
        yield Text(line, style="dim")


def result_panel(result: RunResult) -> Panel:
    """The knee(s) explained and the capacity estimate(s), in sentences."""
    # The target goes inside, not in the title: a border title too long for a narrow terminal is cut off.
    lines: list[Text] = [Text(f"target: {result.target}", style="dim")]
    if result.incomplete is not None:
        lines.append(Text(f"INCOMPLETE: the run stopped early: {result.incomplete}", style="bold red"))
    for knee in result.knee:
        lines.append(Text(knee_sentence(knee), style="bold"))
        if knee.explanation.evidence:
            lines.append(Text(f"  at the knee → past it: {evidence_text(knee.explanation.evidence)}", style="dim"))
    for est in result.capacity:
        lines.append(Text(capacity_sentence(est)))
    lines.extend(Text(line) for line in synthetic_lines(result))
    lines.extend(Text(note, style="italic dim") for note in result.notes)
    if len(lines) == 1:
        lines.append(Text(f"No knee or capacity estimate in this run (mode {result.mode}).", style="dim"))
    return Panel(Group(*lines), title=result.run_id, title_align="left")


def print_result(result: RunResult, console: Console) -> None:
    """The levels (folded to fit the console's width, piped or not), their warnings and markers, then the panel."""
    lt = level_table(result, fold_constant=True)
    # Off a terminal too: a pipe's reader set COLUMNS (or gets rich's 80) and a 190-column line wraps in a log.
    for table in folded_tables(result, console, lt):
        console.print(table)
    for line in _notes(lt):
        console.print(line)
    console.print(result_panel(result))


SHORT_CAUSES = {
    "cache_eviction": "eviction",
    "kv_pool_full": "pool full",
    "slots_full": "slots",
    "compute_saturation": "compute",
    "slo": "SLO",
    "none": "no knee",
}


STATUS_STYLE = {"finished": "green", "interrupted": "yellow", "incomplete": "red"}


def _outcome_cell(e: HistoryEntry) -> Text:
    """Bench: the knee(s) and their causes. Suite and fleet: their headline, one figure per line."""
    if e.kind != "bench":
        return Text("\n".join(e.outcome.split(", ")) or DASH)
    knee = Text("\n".join(k.where or f"{k.agents}" for k in e.knees) or DASH, style="bold")
    if e.knees:
        knee.append("\n" + ", ".join(SHORT_CAUSES.get(k.cause, k.cause) for k in e.knees), style="dim")
    return knee


def history_table(entries: Sequence[HistoryEntry], root: Path) -> Table:
    """Every run, newest first, of every kind. Paths are shown only when some run lives outside ``<root>/<id>``
    or is gone.

    Cells stack two short lines (id over kind and status, date over time, model over target, workload over
    mode, agents over cause) rather than widening the table: on an 80-column terminal rich would otherwise drop
    whole columns.
    """
    show_paths = any(e.path != root / e.id or not e.path.is_dir() for e in entries)
    table = Table(title=f"agentload runs in {escape(str(root))}", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("id\nkind · status", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("model\ntarget", overflow="fold")
    table.add_column("workload\nmode", no_wrap=True)
    table.add_column("knee or\noutcome", justify="right", no_wrap=True)
    table.add_column("best\ntok/s", justify="right")
    if show_paths:
        table.add_column("path", overflow="fold")
    for e in entries:
        ident = Text(e.id)
        ident.append(f"\n{e.kind} · ", style="dim")
        ident.append(e.status, style=STATUS_STYLE.get(e.status, ""))
        model = Text(e.model or DASH)
        model.append("\n" + (e.target or DASH), style="dim")
        cells: list[str | Text] = [
            ident,
            e.created[:16].replace("T", "\n"),
            model,
            f"{e.workload or DASH}\n{e.mode or DASH}",
            _outcome_cell(e),
            num(e.best_output_tps, 0),
        ]
        if show_paths:
            path = Text(str(e.path))
            if not e.path.is_dir():
                path.append(" (missing)", style="red")
            cells.append(path)
        table.add_row(*cells)
    return table
