"""``agentload runs``: every run under a root — bench, suite and fleet, finished or not — newest first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentload.cli.common import console, err_console, reports_errors
from agentload.report.console import history_table
from agentload.store import RunStore
from agentload.store.catalog import status_why
from agentload.store.runstore import check_root

RootOption = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="Root directory of runs (what bench, suite and run take as --out): each run in <root>/<run id>/, "
        "indexed in <root>/history.sqlite (default $AGENTLOAD_RUNS, else ./agentload-runs).",
        show_default=False,
    ),
]


@reports_errors
def runs(
    root: RootOption = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Show only the newest N runs.")] = None,
    rebuild: Annotated[
        bool,
        typer.Option("--rebuild", help="Re-index every run directory under the root first (after copying runs in)."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the history as JSON instead of a table.")] = False,
) -> None:
    """List saved runs of every kind: status, date, target, model, workload, mode, knee or outcome, best tok/s."""
    store = RunStore(root)
    check_root(store.root)  # a file or /proc is a mistake to report, not a root that happens to hold no runs
    if rebuild:
        indexed, skipped = store.history.rebuild()
        console.print(f"indexed {indexed} run{'s' if indexed != 1 else ''} under {store.root}", markup=False)
        for path, why in skipped:
            console.print(f"  skipped {path}: {why}", style="yellow", markup=False, soft_wrap=True)
    entries, damaged = store.listing(limit)
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    for path, why in damaged:
        err_console.print(f"skipped {path}: {why}", style="yellow", markup=False, soft_wrap=True)
    if not entries:
        console.print(f"no runs in {store.root} (run `agentload bench`, `suite` or `run`)", markup=False)
        return
    console.print(history_table(entries, store.root))
    for e in entries:
        if e.status != "finished":
            why = status_why(e.status, e.detail)
            console.print(f"{e.id}: {e.status}" + (f" — {why}" if why else ""), style="dim", markup=False)
