"""``agentload report RUN [RUN…]``: one self-contained, offline HTML file of one or more saved runs of one kind
(bench runs compared side by side; a fleet run's agents and width decisions; a suite run's test × level scores)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentload.cli.common import console, reports_errors
from agentload.cli.runs import RootOption
from agentload.errors import ConfigError
from agentload.report.console import print_result
from agentload.store import RunStore
from agentload.store.catalog import dir_info


@reports_errors
def report(
    run_refs: Annotated[
        list[str],
        typer.Argument(
            metavar="RUN...",
            help="Run directories (or a bench run's result.json) or run ids: bench, suite or fleet, one kind.",
            show_default=False,
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("report.html"),
    root: RootOption = None,
    title: Annotated[str | None, typer.Option("--title", help="The report's title. Default: the run id(s).")] = None,
    print_tables: Annotated[
        bool, typer.Option("--print", "-p", help="Also print each run's levels, knee and capacity estimate here.")
    ] = False,
) -> None:
    """Render saved runs into one HTML file with interactive plots; several runs are compared side by side."""
    # Imported here, not at the top: plotly takes about a second to import, and the CLI imports every command
    # module at start-up — `agentload runs` or `agentload sim` should not wait for it.
    from agentload.report.html import write_report
    from agentload.report.runpages import print_run_page, write_run_page

    store = RunStore(root)
    dirs = [store.resolve(ref) for ref in run_refs]
    kinds = {d.path: (info.kind if (info := dir_info(d.path)) is not None else "bench") for d in dirs}
    kind = next(iter(kinds.values()))
    if any(k != kind for k in kinds.values()):
        listed = ", ".join(f"{p.name} ({k})" for p, k in kinds.items())
        raise ConfigError(f"a report compares runs of one kind; these are of several: {listed}")
    if kind == "bench":
        stats = write_report(dirs, output, title=title)
        if print_tables:
            for run in dirs:
                print_result(run.result(), console)
    else:
        stats = write_run_page(kind, [d.path for d in dirs], output, title=title)
        if print_tables:
            print_run_page(kind, [d.path for d in dirs], console)
    console.print(
        f"wrote {stats.path} ({stats.bytes / 1e6:.1f} MB, {len(dirs)} {'' if kind == 'bench' else kind + ' '}"
        f"run{'s' if len(dirs) != 1 else ''}, {stats.plots} plots, {stats.seconds:.2f} s)",
        soft_wrap=True,  # the path whole, so it can be copied
    )
