"""``agentload dashboard RUN``: replay a finished or interrupted fleet or bench run on a local page, read-only, with a
time slider.

The page is the live dashboard's own (``agentload.dashboard``), served on 127.0.0.1 behind a new random token that
is printed once, like ``agentload run --dashboard``; the state at each time is compiled from the run directory
(``dashboard.replay``). It serves until Ctrl-C.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from agentload.cli.common import OutOption, err_console, reports_errors
from agentload.dashboard.server import serve_replay
from agentload.store.runstore import run_root


def resolve_run(run: Path, out: Path | None) -> Path:
    """A run directory, or a run id as ``agentload runs`` lists it, under the root of runs."""
    if not run.is_dir() and len(run.parts) == 1 and (run_root(out) / run).is_dir():
        return run_root(out) / run
    return run


@reports_errors
def dashboard(
    run: Annotated[Path, typer.Argument(help="The run directory (or its id under --out) to replay.")],
    out: OutOption = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="The page's port (0: a free one).")] = 0,
) -> None:
    """Replay a finished or interrupted fleet or bench run on a local page, read-only, with a time slider."""
    run_dir = resolve_run(run, out)

    def show(url: str) -> None:
        err_console.print(f"dashboard (replay of {run_dir}): {url}", markup=False, soft_wrap=True)
        err_console.print("read-only; Ctrl-C to stop serving", markup=False)

    try:
        asyncio.run(serve_replay(run_dir, port=port, on_url=show))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
