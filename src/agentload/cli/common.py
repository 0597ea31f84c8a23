"""What every command shares: the consoles, the oracle's scenario book, and turning our errors into exit status 2."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from agentload.errors import AgentloadError
from agentload.sim.behaviour import ScenarioBook
from agentload.sim.scenarios import builtin_scenarios
from agentload.suite.oracle import scenarios as suite_scenarios

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

P = ParamSpec("P")
R = TypeVar("R")

EXIT_USAGE = 2


def default_book() -> ScenarioBook:
    """The simulator's built-in scenarios plus one per behaviour-suite test, for ``OracleBehaviour``.

    Built here, at the composition root, because the suite imports the simulator: were the simulator to load the
    suite's scenarios itself, the two packages would import each other (issue 10).
    """
    return ScenarioBook([*builtin_scenarios(), *suite_scenarios()])


@contextmanager
def clean_errors() -> Iterator[None]:
    """One clear line and exit status 2 for anything agentload raises on purpose — never a traceback."""
    try:
        yield
    except AgentloadError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from exc


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of ``clean_errors`` for command functions (keeps typer's signature inspection intact)."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with clean_errors():
            return func(*args, **kwargs)

    return wrapper
