"""What every command shares: the consoles, the options every server-facing command spells the same way, the
oracle's scenario book, and turning our errors into exit status 2."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from agentload.dashboard.server import MAX_DASHBOARD_RATE, MIN_DASHBOARD_RATE
from agentload.endpoint.apikey import DEFAULT_API_KEY_ENV
from agentload.endpoint.redact import redact
from agentload.errors import AgentloadError, ConfigError
from agentload.load.cluster import ExecutorSpec

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

P = ParamSpec("P")
R = TypeVar("R")

EXIT_USAGE = 2

# The options every command that talks to a server or writes results shares: one name, one help text, one meaning
# everywhere. A command that has no use for one leaves it out rather than accepting it and ignoring it.
ApiKeyEnvOption = Annotated[
    str | None,
    typer.Option(
        "--api-key-env",
        metavar="VAR",
        help=f"Environment variable holding the server's API key, sent as a Bearer token and never stored "
        f"(default {DEFAULT_API_KEY_ENV}, when set).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout instead of tables.")]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Root directory of runs, each run in a directory of its own (default $AGENTLOAD_RUNS, else "
        "./agentload-runs).",
        show_default=False,
    ),
]

ExecutorOption = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="local|ray",
        # Help is rich markup: "[ray]" unescaped would be read as a style tag and vanish from the command.
        help="Where the agents run: local (this process, one core) or ray (Ray async actors, one per core, on this "
        "machine or a cluster; pip install 'agentload\\[ray]').",
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDR",
        help="With --executor ray: an existing Ray cluster (e.g. auto, or the head's host:6379); default: start a "
        "local Ray of this machine's cores.",
        show_default=False,
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="With --executor ray: how many actors (default: one per CPU of the cluster).",
        show_default=False,
    ),
]


DashboardRateOption = Annotated[
    float | None,
    typer.Option(
        "--dashboard-rate",
        metavar="HZ",
        help=f"With --dashboard: the page's updates a second (default 4; {MIN_DASHBOARD_RATE:g} to "
        f"{MAX_DASHBOARD_RATE:g}). Fewer cost the browser and the dashboard's own flushes less (docs/dashboard.md).",
        show_default=False,
    ),
]


def executor_spec(executor: str, ray_address: str | None, workers: int | None) -> ExecutorSpec:
    """``--executor`` and its options checked together (one clear error for a wrong combination)."""
    if executor not in ("local", "ray"):
        raise ConfigError(f"--executor must be local or ray, got {executor!r}")
    return ExecutorSpec(kind="ray" if executor == "ray" else "local", address=ray_address, workers=workers)


@contextmanager
def clean_errors() -> Iterator[None]:
    """One clear line and exit status 2 for anything agentload raises on purpose — never a traceback."""
    try:
        yield
    except AgentloadError as exc:
        # Redacted: an error may quote what a server said, and a server may echo the key.
        # Escaped: the message may quote the user's input, and "[/x]" in it is text, not a markup tag.
        err_console.print(f"[bold red]error:[/] {escape(redact(str(exc)))}", markup=True, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from exc


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of ``clean_errors`` for command functions (keeps typer's signature inspection intact)."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with clean_errors():
            return func(*args, **kwargs)

    return wrapper
