"""The terminal view of saved runs (rich): a run's levels, knee and capacity; the run history as a table.

It shows the same cells and sentences as the HTML report (``report.text``), so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, JustifyMethod
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentload.bench.results import RunResult
from agentload.report.text import DASH, capacity_sentence, knee_sentence, level_table, num
from agentload.store.history import HistoryEntry


def levels_table(result: RunResult) -> Table:
    table = level_table(result)
    out = Table(title=f"{result.run_id} · {result.model} · {result.workload}", title_justify="left", expand=False)
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


def history_table(entries: Sequence[HistoryEntry]) -> Table:
    table = Table(title="agentload runs", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("id", "left"),
        ("date", "left"),
        ("target", "left"),
        ("model", "left"),
        ("workload", "left"),
        ("mode", "left"),
        ("knee", "right"),
        ("best output tok/s", "right"),
        ("path", "left"),
    ]
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for e in entries:
        knee = ", ".join(f"{k.agents} ({k.cause})" for k in e.knees) or DASH
        missing = "" if e.path.is_dir() else " [red](missing)[/]"
        table.add_row(
            e.id,
            e.created[:19].replace("T", " "),
            e.target,
            e.model,
            e.workload,
            e.mode,
            knee,
            num(e.best_output_tps, 0),
            Text.from_markup(f"{Text(str(e.path)).markup}{missing}"),
        )
    return table
