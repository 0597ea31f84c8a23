"""The terminal view of saved runs (rich): a run's levels, knee and capacity; the run history as a table.

It shows the same cells and sentences as the HTML report (``report.text``), so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentload.bench.results import RunResult
from agentload.report.text import DASH, capacity_sentence, knee_sentence, level_table, num
from agentload.store.history import HistoryEntry


def levels_table(result: RunResult) -> Table:
    table = level_table(result, fold_constant=True)
    title = " · ".join([result.run_id, result.model, result.workload, *table.constants])
    out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for i, header in enumerate(table.headers):
        out.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    for row, is_knee in zip(table.rows, table.knee_rows, strict=True):
        out.add_row(*row, style="bold yellow" if is_knee else None)
    return out


def result_panel(result: RunResult) -> Panel:
    """The knee(s) explained and the capacity estimate(s), in sentences."""
    lines: list[Text] = []
    for knee in result.knee:
        lines.append(Text(knee_sentence(knee), style="bold"))
        if knee.explanation.evidence:
            evidence = ", ".join(f"{k} {v:,.4g}" for k, v in knee.explanation.evidence.items())
            lines.append(Text(f"  evidence: {evidence}", style="dim"))
    for est in result.capacity:
        lines.append(Text(capacity_sentence(est)))
    if result.real_over_synthetic is not None:
        lines.append(Text(f"Real agents ÷ matched synthetic load, output throughput: {result.real_over_synthetic:.2f}"))
    lines.extend(Text(note, style="italic dim") for note in result.notes)
    if not lines:
        lines.append(Text(f"No knee or capacity estimate in this run (mode {result.mode}).", style="dim"))
    return Panel(Group(*lines), title=f"{result.run_id}: {result.target}", title_align="left")


def print_result(result: RunResult, console: Console) -> None:
    console.print(levels_table(result))
    console.print(result_panel(result))


SHORT_CAUSES = {"cache_eviction": "eviction", "compute_saturation": "compute", "slo": "SLO"}


def history_table(entries: Sequence[HistoryEntry], root: Path) -> Table:
    """The history, newest first. Paths are shown only when some run lives outside ``<root>/<id>`` or is gone.

    Cells stack two short lines (date over time, model over target, workload over mode, agents over cause)
    rather than widening the table: on an 80-column terminal rich would otherwise drop whole columns.
    """
    show_paths = any(e.path != root / e.id or not e.path.is_dir() for e in entries)
    table = Table(title=f"agentload runs in {root}", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("id", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("model\ntarget", overflow="fold")
    table.add_column("workload\nmode", no_wrap=True)
    table.add_column("knee", justify="right", no_wrap=True)
    table.add_column("best\ntok/s", justify="right")
    if show_paths:
        table.add_column("path", overflow="fold")
    for e in entries:
        knee = Text("\n".join(f"{k.agents}" for k in e.knees) or DASH, style="bold")
        if e.knees:
            knee.append("\n" + ", ".join(SHORT_CAUSES.get(k.cause, k.cause) for k in e.knees), style="dim")
        model = Text(e.model)
        model.append("\n" + e.target, style="dim")
        cells: list[str | Text] = [
            e.id,
            e.created[:16].replace("T", "\n"),
            model,
            f"{e.workload}\n{e.mode}",
            knee,
            num(e.best_output_tps, 0),
        ]
        if show_paths:
            path = Text(str(e.path))
            if not e.path.is_dir():
                path.append(" (missing)", style="red")
            cells.append(path)
        table.add_row(*cells)
    return table
